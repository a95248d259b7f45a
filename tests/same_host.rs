//! The same-host transport end to end: real `sluice cpu` processes serving a Unix socket,
//! clients attaching shared memory. Every sample arrives once and intact (the same tensor
//! bytes the in-process engine makes), also when a worker is killed with SIGKILL mid-epoch;
//! a killed client leaves no segment mapped in the worker; strangers cannot attach.

mod support;
mod system;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_client::{Loader, SameHost};
use support::{path_str, signal};
use system::{assert_exactly_once, dataset, planned, start_worker_with, trust_file, Worker, TOKEN};

const PIPELINE: &str = "decode | random_resized_crop 64 | hflip 0.5";

fn same_host_worker(dir: &Path, name: &str) -> Worker {
    let sockets = dir.join("sockets");
    start_worker_with(dir, name, &["--same-host-dir", path_str(&sockets)])
}

/// The dataset (40 samples a shard) and two same-host workers, `a` and `b`, with the
/// certificates that pin them.
fn two_workers(dir: &Path) -> (system::Dataset, Worker, Worker, std::path::PathBuf) {
    let data = dataset(dir, 40);
    let a = same_host_worker(dir, "a");
    let b = same_host_worker(dir, "b");
    let trust = trust_file(dir, &[&a, &b]);
    (data, a, b, trust)
}

/// The dataset and one same-host worker, `a`, with the certificate that pins it.
fn one_worker(dir: &Path) -> (system::Dataset, Worker, std::path::PathBuf) {
    let data = dataset(dir, 40);
    let a = same_host_worker(dir, "a");
    let trust = trust_file(dir, &[&a]);
    (data, a, trust)
}

fn loader(data: &system::Dataset, dir: &Path, workers: &[&Worker], trust: &Path) -> Loader {
    builder(data, dir, trust)
        .workers(workers.iter().map(|w| w.addr.clone()).collect::<Vec<_>>())
        .build()
        .unwrap()
}

/// The tests' loader settings, but the workers.
fn builder(data: &system::Dataset, dir: &Path, trust: &Path) -> sluice_client::LoaderBuilder {
    Loader::builder()
        .dataset(data.manifest.clone())
        .token(TOKEN)
        .trust_cert(trust)
        .same_host(SameHost::Require)
        .same_host_dir(dir.join("sockets"))
        .pipeline(PIPELINE.into())
        .batch_size(8)
        .max_unit_samples(32)
        .mixing(MIXING)
        .lookahead(16)
        .credits_per_worker(16)
        .heartbeat(Duration::from_millis(300))
        .silence(Duration::from_millis(1500))
        .worker_wait(Duration::from_secs(20))
        .seed(3)
}

/// A counter from a worker's Prometheus text.
fn counter(worker: &Worker, name: &str) -> f64 {
    system::metrics_text(worker)
        .lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// Whether the loader has units out at `worker` (the client's own view, which decides what
/// a kill or stop makes it move elsewhere).
fn holds_units(l: &Loader, worker: &Worker) -> bool {
    l.stats()
        .workers
        .iter()
        .any(|w| w.name.contains(&worker.addr) && w.in_flight_units > 0)
}

/// A sample: (shard, index).
type Id = (u32, u64);

/// What an epoch delivered: its samples in batch order, and each one's tensor digest.
#[derive(Default)]
struct Arrived {
    order: Vec<Id>,
    digests: HashMap<Id, u64>,
}

impl Arrived {
    fn take(&mut self, batch: &sluice_client::Batch) {
        let n = batch.shape().bytes() as usize;
        for (i, id) in batch.ids().iter().enumerate() {
            let t = &batch.images()[i * n..(i + 1) * n];
            let id = (id.shard, id.index);
            self.order.push(id);
            self.digests.insert(id, xxhash_rust::xxh3::xxh3_64(t));
        }
    }
}

/// The in-process engine's epoch, with the same plan: what every transport must deliver.
fn reference(data: &system::Dataset, epoch: u64) -> Arrived {
    let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default()).unwrap();
    let engine = sluice_cpu::EngineConfig {
        threads: 2,
        ..Default::default()
    };
    let worker = Arc::new(sluice_cpu::CpuWorker::new(engine, source).unwrap());
    let l = Loader::builder()
        .dataset(data.manifest.clone())
        .in_process(worker)
        .pipeline(PIPELINE.into())
        .batch_size(8)
        .max_unit_samples(32)
        .mixing(MIXING)
        .seed(3)
        .build()
        .unwrap();
    let mut arrived = Arrived::default();
    for batch in l.epoch(epoch).unwrap() {
        arrived.take(&batch.unwrap());
    }
    arrived
}

/// A narrow mixing window: with the small lookahead, workers stay near the consumer, so the
/// kill lands on units still in flight.
const MIXING: sluice_client::Mixing = sluice_client::Mixing {
    window_units: 2,
    buffer_samples: 16,
};

/// An epoch's batches are the in-process engine's: its order, each sample once, and its
/// tensors byte for byte.
fn same_as_in_process(data: &system::Dataset, epoch: u64, got: Arrived) {
    let expected = reference(data, epoch);
    assert!(
        got.order == expected.order,
        "epoch {epoch}: shared memory gave another order than the in-process engine"
    );
    assert_exactly_once(
        &format!("epoch {epoch}"),
        planned(&data.manifest, 3, 1, 0, epoch),
        got.order,
    );
    let torn: Vec<_> = expected
        .digests
        .iter()
        .filter(|(id, d)| got.digests.get(id) != Some(d))
        .map(|(id, _)| *id)
        .collect();
    assert!(
        torn.is_empty(),
        "epoch {epoch}: {} samples differ from the in-process engine's, e.g. {:?}",
        torn.len(),
        &torn[..torn.len().min(5)]
    );
}

/// An epoch of `l` with its batches checked against the in-process engine's, killing `victim`
/// (when given) from a third of the epoch on, at the first batch at which the client holds
/// units there: its report, and whether the kill happened.
fn epoch_killing(
    data: &system::Dataset,
    l: &Loader,
    epoch: u64,
    mut victim: Option<&mut Worker>,
) -> (sluice_client::EpochReport, bool) {
    let kill_from = l.batches_per_epoch() / 3;
    let mut killed = false;
    let mut got = Arrived::default();
    let mut stream = l.epoch(epoch).unwrap();
    for (n, batch) in stream.by_ref().enumerate() {
        let batch = batch.unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
        got.take(&batch);
        if let Some(w) = victim.as_deref_mut() {
            if !killed && n as u64 >= kill_from && holds_units(l, w) {
                w.kill9();
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = stream.report();
    same_as_in_process(data, epoch, got);
    eprintln!("epoch {epoch}: {report:?}");
    (report, killed)
}

#[test]
fn samples_arrive_once_and_intact_through_shared_memory_even_when_a_worker_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (data, mut a, b, trust) = two_workers(dir.path());
    let l = loader(&data, dir.path(), &[&a, &b], &trust);
    epoch_killing(&data, &l, 0, None);
    drop(l);
    // The kill must land while `a` still owes samples of a unit it holds. The client's view
    // can say `a` holds a unit whose last samples it already sent (their frames not yet
    // read), so a kill can move nothing: that is the scenario not made, not the product
    // failing, and it runs again on a restarted `a` (its state directory, so its certificate,
    // kept). Every attempt's batches are checked all the same.
    let mut moved = false;
    for attempt in 0..6 {
        let l = loader(&data, dir.path(), &[&a, &b], &trust);
        let (report, killed) = epoch_killing(&data, &l, 1, Some(&mut a));
        drop(l);
        if killed && report.reassigned > 0 {
            moved = true;
            break;
        }
        eprintln!(
            "attempt {attempt}: the kill moved nothing (killed: {killed}); again on a restarted a"
        );
        a = same_host_worker(dir.path(), "a");
    }
    assert!(
        moved,
        "in 6 epochs, no kill of a worker holding units made the client move one"
    );
    // The samples went through shared memory, not QUIC, most straight into their batches.
    let shared = counter(&b, "sluice_cpu_same_host_samples_total");
    let framed = counter(&b, "sluice_cpu_samples_sent_total");
    let placed = counter(&b, "sluice_cpu_placed_samples_total");
    let resized = counter(&b, "sluice_cpu_resized_in_place_total");
    eprintln!(
        "same-host {shared}, of which placed {placed} ({resized} resized straight into their \
         place); QUIC {framed}"
    );
    assert!(
        resized > 0.0,
        "no sample was resized straight into its batch"
    );
    assert!(
        shared > 0.0 && framed == 0.0,
        "same-host {shared}, QUIC {framed}"
    );
    assert!(
        placed > 0.0,
        "no sample was written straight into its batch"
    );
}

/// A loop that leaves epochs early (as Lightning's `limit_train_batches` does) cuts units
/// mid-way on healthy workers; they release the batch places those units still held, so later
/// epochs still get their samples written straight into their batches (the arena is not used
/// up by places nobody will write), and every batch is still the in-process engine's.
#[test]
fn epochs_left_early_give_their_batch_places_back() {
    let dir = tempfile::tempdir().unwrap();
    let (data, a, b, trust) = two_workers(dir.path());
    let l = loader(&data, dir.path(), &[&a, &b], &trust);
    let sum = |name| counter(&a, name) + counter(&b, name);
    for epoch in 0..4u64 {
        let mut stream = l.epoch(epoch).unwrap();
        for _ in 0..3 {
            stream.next().unwrap().unwrap();
        }
    }
    let placed = sum("sluice_cpu_placed_samples_total");
    let shared = sum("sluice_cpu_same_host_samples_total");
    let epoch = 4;
    let mut got = Arrived::default();
    for batch in l.epoch(epoch).unwrap() {
        let batch = batch.unwrap();
        got.take(&batch);
        std::thread::sleep(Duration::from_millis(5));
    }
    same_as_in_process(&data, epoch, got);
    let placed = sum("sluice_cpu_placed_samples_total") - placed;
    let shared = sum("sluice_cpu_same_host_samples_total") - shared;
    eprintln!("after four epochs left early: {placed} of {shared} samples placed");
    assert!(
        placed > shared / 2.0,
        "{placed} of {shared} samples placed: the batch arena was used up"
    );
}

/// An epoch binds its batches as far ahead as the epochs before it found samples arriving,
/// from its start: the samples of its first units get their places with their assignment
/// instead of waiting in slots (and being copied) while the epoch learns how far ahead they
/// come. An epoch started early (the default) binds its batches as soon as the earlier epoch
/// hands over the ring and as the consumer frees buffers, not only when a sample or a batch
/// happens to come.
#[test]
fn later_epochs_place_their_first_units_samples_straight_into_their_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (data, worker, trust) = one_worker(dir.path());
    let sum = |name| counter(&worker, name);
    // (started early, the least share placed in epochs after the first, on average.) Why the
    // mean of the later epochs and 0.85, not every epoch at 0.88: started early, the next
    // epoch's first unit is decoded while this epoch's last batches still hold the ring, and
    // whether a buffer is free for its samples is a race between the consumer and the worker
    // that no state of the test decides; per epoch that gave 0.845-0.99 on 2-core VMs (failing
    // 0.88 3 runs in 4 before any change), its mean 0.87-0.95, while the fault this guards
    // (binding only when a sample or a batch came) gave 0.81. 0.85 sits between the two.
    for (prefetch, least) in [(false, 0.98), (true, 0.85)] {
        let l = builder(&data, dir.path(), &trust)
            .workers(vec![worker.addr.clone()])
            .prefetch_next_epoch(prefetch)
            .build()
            .unwrap();
        let mut fractions = Vec::new();
        for epoch in 0..4u64 {
            let (placed, shared) = (
                sum("sluice_cpu_placed_samples_total"),
                sum("sluice_cpu_same_host_samples_total"),
            );
            let mut got = Arrived::default();
            for batch in l.epoch(epoch).unwrap() {
                got.take(&batch.unwrap());
                // A consumer slower than the worker: samples arrive ahead of their batches.
                std::thread::sleep(Duration::from_millis(5));
            }
            same_as_in_process(&data, epoch, got);
            // Started early, the next epoch's first samples are counted with this one's.
            let placed = sum("sluice_cpu_placed_samples_total") - placed;
            let shared = sum("sluice_cpu_same_host_samples_total") - shared;
            fractions.push(placed / shared.max(1.0));
        }
        drop(l);
        eprintln!("prefetch {prefetch}: samples placed in their batches, by epoch: {fractions:?}");
        let later = &fractions[1..];
        assert!(
            later.iter().sum::<f64>() / later.len() as f64 >= least,
            "prefetch {prefetch}: after the first epoch, on average more than {:.0}% of samples waited \
             in a slot: {fractions:?}",
            (1.0 - least) * 100.0
        );
    }
}

/// The inode of each memfd segment mapping of process `pid` (a worker of one test maps only
/// that test's client's segments; this process holds every test's).
fn segment_maps(pid: u32) -> Vec<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("memfd:sluice-slots"))
        .filter_map(|l| l.split_whitespace().nth(4)?.parse().ok())
        .collect()
}

/// One loader over several epochs keeps its segments for its next connections, and never
/// hands out one a live worker may still write: worker `a` is stopped mid-epoch (its units
/// still out, its slots granted) until it is declared lost, then resumed an epoch later,
/// when its old connection's units may still write their slots. Every epoch's batches are
/// the in-process engine's, in its order and byte for byte.
#[test]
fn segments_are_kept_across_epochs_and_a_stalled_workers_never_handed_out() {
    let dir = tempfile::tempdir().unwrap();
    let (data, a, b, trust) = two_workers(dir.path());
    let l = loader(&data, dir.path(), &[&a, &b], &trust);
    let epochs = 4u64;
    let mut seen = std::collections::HashSet::new();
    for epoch in 0..epochs {
        let mut stall_at = (epoch == 1).then_some(l.batches_per_epoch() / 3);
        if epoch == 2 {
            signal(a.child.id(), "-CONT");
        }
        let mut got = Arrived::default();
        let mut stream = l.epoch(epoch).unwrap();
        for (n, batch) in stream.by_ref().enumerate() {
            let batch = batch.unwrap_or_else(|e| panic!("epoch {epoch}: {e}"));
            got.take(&batch);
            seen.extend(segment_maps(a.child.id()));
            seen.extend(segment_maps(b.child.id()));
            if stall_at.is_some_and(|k| n as u64 >= k) && holds_units(&l, &a) {
                signal(a.child.id(), "-STOP");
                stall_at = None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let report = stream.report();
        eprintln!("epoch {epoch}: {report:?}");
        same_as_in_process(&data, epoch, got);
        if epoch == 1 {
            assert!(stall_at.is_none(), "worker a never held units to stop");
            assert!(report.reassigned > 0, "the stalled worker's units moved");
        }
    }
    // Two workers, four epochs: a segment per connection would be eight or more.
    eprintln!("{} segments over {epochs} epochs", seen.len());
    assert!(
        seen.len() < 2 * epochs as usize,
        "{} segments for {epochs} epochs of two workers: none was kept",
        seen.len()
    );
    assert!(
        counter(&a, "sluice_cpu_same_host_samples_total") > 0.0,
        "the resumed worker served again"
    );
    for w in [&a, &b] {
        let placed = counter(w, "sluice_cpu_placed_samples_total");
        let shared = counter(w, "sluice_cpu_same_host_samples_total");
        eprintln!("placed {placed} of {shared}");
        assert!(
            placed > 0.0,
            "no sample was written straight into its batch"
        );
    }
}

/// The pool as a workers file that changes mid-epoch, over shared memory: a worker added to
/// it gets units (and its samples come through its segments), the first one, removed, is
/// drained; the batches and their bytes are the in-process engine's.
#[test]
fn a_pool_that_grows_and_shrinks_mid_epoch_keeps_batches_over_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (data, a, b, trust) = two_workers(dir.path());
    let pool = dir.path().join("workers");
    std::fs::write(&pool, format!("{}\n", a.addr)).unwrap();
    let l = builder(&data, dir.path(), &trust)
        .workers_file(&pool)
        .workers_refresh(Duration::from_millis(50))
        .epochs(1)
        .build()
        .unwrap();
    let batches = l.batches_per_epoch();
    let mut got = Arrived::default();
    for (n, batch) in l.epoch(0).unwrap().enumerate() {
        let batch = batch.unwrap();
        got.take(&batch);
        let n = n as u64;
        if n == batches / 5 {
            std::fs::write(&pool, format!("{}\n{}\n", a.addr, b.addr)).unwrap();
        }
        if n == batches / 2 {
            std::fs::write(&pool, format!("{}\n", b.addr)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let expected = reference(&data, 0);
    assert!(
        got.order == expected.order,
        "the pool's changes changed the batches"
    );
    assert!(
        got.digests == expected.digests,
        "a sample's bytes differ from the in-process engine's"
    );
    let stats = l.stats();
    assert_eq!(stats.pool_changes, 2, "{stats:?}");
    let shared = counter(&b, "sluice_cpu_same_host_samples_total");
    assert!(
        shared > 0.0,
        "the worker that joined sent nothing through shared memory"
    );
}

#[test]
fn a_killed_client_leaves_no_segment_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (data, w, trust) = one_worker(dir.path());
    let token = dir.path().join("token");
    let mut client = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "loadgen",
            "--dataset",
            path_str(&data.manifest_path),
            "--workers",
            &w.addr,
            "--token-file",
            path_str(&token),
            "--trust-cert",
            path_str(&trust),
            "--same-host",
            "require",
            "--same-host-dir",
            path_str(&dir.path().join("sockets")),
            "--batch-size",
            "4",
            "--step-ms",
            "300",
            "--pipeline",
            "decode | resize 32 | center_crop 32",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = w.child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while segment_maps(pid).is_empty() {
        assert!(Instant::now() < deadline, "the client never attached");
        assert!(
            client.try_wait().unwrap().is_none(),
            "the client ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = client.kill();
    let _ = client.wait();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !segment_maps(pid).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the worker still maps the dead client's segment"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(w.log_contains("same-host client left") || w.log_contains("closing")) {
        assert!(
            Instant::now() < deadline,
            "the worker never logged the client leaving"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Root only: a process of another user (nobody) is refused by the socket's mode, and, when
/// the mode lets it connect, by the worker's peer-credential check.
#[test]
fn strangers_cannot_attach() {
    let Some(python) = python_as_another_user("the stranger") else {
        return;
    };
    // A directory everyone may enter, as /run/sluice is.
    let sockets = std::env::temp_dir().join(format!("sluice-strangers-{}", std::process::id()));
    std::fs::create_dir_all(&sockets).unwrap();
    std::fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = support::write_file(
        &dir.path().join("cpu.toml"),
        &format!(
            "[same_host]\nsocket_dir = \"{}\"\nsocket_mode = 0o666\n",
            sockets.display()
        ),
    );
    let w = start_worker_with(dir.path(), "a", &["--config", path_str(&config)]);
    let port = w.addr.rsplit(':').next().unwrap();
    let socket = sockets.join(format!("cpu-{port}.sock"));
    let stranger = |socket: &Path| -> String {
        let script = "import socket, sys\n\
                      s = socket.socket(socket.AF_UNIX)\n\
                      try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print('connect:', e); sys.exit(0)\n\
                      s.settimeout(5)\n\
                      print(s.recv(4096).decode('latin-1'))\n";
        let out = std::process::Command::new(python)
            .current_dir("/")
            .args(["-c", script, path_str(socket)])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let said = stranger(&socket);
    assert!(
        said.contains("uid 65534") && said.contains("may not attach"),
        "{said}"
    );
    assert!(w.log_shows("same-host client refused", Duration::from_secs(10)));
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o660)).unwrap();
    let said = stranger(&socket);
    assert!(
        said.contains("connect:") && said.contains("Permission denied"),
        "{said}"
    );
    drop(w);
    let _ = std::fs::remove_dir_all(&sockets);
}

use std::os::unix::process::CommandExt;

/// A process of user nobody that listens at `socket` (making its directory first, 0755 and
/// its own, when `make_dir`), accepts every connection and prints each byte count it is
/// sent: started, and its output once it says it listens.
fn listen_as_nobody(
    python: &Path,
    socket: &Path,
    make_dir: bool,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mkdir = match make_dir {
        true => "os.mkdir(os.path.dirname(sys.argv[1]), 0o755)\n",
        false => "",
    };
    let script = format!(
        "import os, socket, sys\n{mkdir}\
         s = socket.socket(socket.AF_UNIX)\n\
         s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(16)\n\
         print('listening', flush=True)\n\
         while True:\n    c, _ = s.accept()\n    print('accepted', flush=True)\n    \
         while True:\n        d = c.recv(65536)\n        if not d: break\n        \
         print('got', len(d), flush=True)\n"
    );
    let mut child = std::process::Command::new(python)
        .current_dir("/")
        .args(["-c", &script, path_str(socket)])
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "listening");
    (child, out)
}

/// The system Python, for a process of another user to play `who` in, when this test can
/// start one (root, and `/usr/bin/python3`: one under root's home is not executable by
/// another user); else `None`, said as a skip.
fn python_as_another_user(who: &str) -> Option<&'static Path> {
    if effective_uid() != 0 {
        eprintln!("skipped: needs root to run {who} as another user");
        return None;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("skipped: no /usr/bin/python3 to play {who}");
        return None;
    }
    Some(python)
}

/// This process's effective user: /proc/self belongs to it.
fn effective_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX)
}

/// Root only: a process of another user (nobody) that listens on a worker's socket path, in a
/// directory everyone may write (sticky, as /tmp), gets nothing of the client: not its token,
/// not its memory. The client checks the socket's owner and the listening process's user
/// before it sends a byte, refuses by name, and reaches the worker over QUIC instead; with
/// same-host required, the epoch fails naming the impostor's user.
#[test]
fn a_same_host_impostor_of_another_user_gets_nothing_and_the_client_uses_quic() {
    let Some(python) = python_as_another_user("the impostor") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    let w = system::start_worker(dir.path(), "a"); // QUIC only: its socket is not there
    let trust = trust_file(dir.path(), &[&w]);
    let sockets = std::env::temp_dir().join(format!("sluice-impostor-{}", std::process::id()));
    std::fs::create_dir_all(&sockets).unwrap();
    std::fs::set_permissions(
        &sockets,
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    let port = w.addr.rsplit(':').next().unwrap();
    let socket = sockets.join(format!("cpu-{port}.sock"));
    let (mut impostor, mut out) = listen_as_nobody(python, &socket, false);

    let l = builder(&data, dir.path(), &trust)
        .same_host(SameHost::Auto)
        .same_host_dir(sockets.clone())
        .workers([w.addr.clone()])
        .build()
        .unwrap();
    let got: Vec<Id> = l
        .epoch(0)
        .unwrap()
        .flat_map(|b| {
            let b = b.unwrap();
            b.ids()
                .iter()
                .map(|id| (id.shard, id.index))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_exactly_once("over QUIC", planned(&data.manifest, 3, 1, 0, 0), got);
    drop(l);
    let required = builder(&data, dir.path(), &trust)
        .same_host_dir(sockets.clone())
        .workers([w.addr.clone()])
        .build()
        .unwrap();
    let err = match required.epoch(0).map(|mut e| e.find_map(Result::err)) {
        Ok(Some(e)) | Err(e) => e.to_string(),
        Ok(None) => panic!("same-host was required, yet the impostor was let through"),
    };
    assert!(err.contains("uid 65534"), "{err}");
    drop(required);

    let _ = impostor.kill();
    let _ = impostor.wait();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut out, &mut said).unwrap();
    assert!(
        said.contains("accepted"),
        "the client never even connected: {said}"
    );
    assert!(
        !said.contains("got"),
        "the impostor was sent bytes (the token, a descriptor):\n{said}"
    );
    let _ = std::fs::remove_dir_all(&sockets);
}

/// Root only: another user who makes the agreed socket directory first, under a folder every
/// user can write (`/tmp`), owns it (0755) and listens in it. The client does not trust that
/// directory's owner: it refuses by name and sends nothing (with same-host required, the
/// epoch fails saying so), and a worker told to serve there makes no socket in it: it serves
/// QUIC only, naming the directory and its owner.
#[test]
fn whoever_makes_a_shared_socket_directory_first_is_not_trusted() {
    let Some(python) = python_as_another_user("the other user") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path(), 40);
    let w = system::start_worker(dir.path(), "a");
    let trust = trust_file(dir.path(), &[&w]);
    let sockets = std::env::temp_dir().join(format!("sluice-first-{}", std::process::id()));
    let port = w.addr.rsplit(':').next().unwrap();
    let socket = sockets.join(format!("cpu-{port}.sock"));
    // As nobody: make the directory (0755, theirs), listen in it, report what arrives.
    let (mut other, mut out) = listen_as_nobody(python, &socket, true);

    let required = builder(&data, dir.path(), &trust)
        .same_host_dir(sockets.clone())
        .workers([w.addr.clone()])
        .build()
        .unwrap();
    let err = match required.epoch(0).map(|mut e| e.find_map(Result::err)) {
        Ok(Some(e)) | Err(e) => e.to_string(),
        Ok(None) => panic!("same-host was required, yet the directory's maker was trusted"),
    };
    assert!(err.contains("made it first"), "{err}");
    drop(required);

    let config = support::write_file(
        &dir.path().join("cpu.toml"),
        &format!("[same_host]\nsocket_dir = \"{}\"\n", sockets.display()),
    );
    // The worker serves QUIC only, saying why: the directory is another user's.
    let b = start_worker_with(dir.path(), "b", &["--config", path_str(&config)]);
    let off = "same-host transport off";
    assert!(
        b.log_shows(off, Duration::from_secs(10)),
        "no word of the directory"
    );
    let said = b.log.lock().unwrap().join("\n");
    assert!(
        said.contains(path_str(&sockets)) && said.contains("uid 65534"),
        "{said}"
    );
    let b_port = b.addr.rsplit(':').next().unwrap();
    assert!(!sockets.join(format!("cpu-{b_port}.sock")).exists());
    drop(b);

    let _ = other.kill();
    let _ = other.wait();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut out, &mut said).unwrap();
    assert!(
        !said.contains("got"),
        "the other user was sent bytes:\n{said}"
    );
    let _ = std::fs::remove_dir_all(&sockets);
}

/// A loop that keeps every batch (a list that only grows) meets the ring's bound over shared
/// memory as it does in process and over QUIC: the documented error once it holds
/// `ring_batches`, not memory that grows with every batch (the batch arena's buffers bound
/// ahead are the workers', not more room for the consumer).
#[test]
fn a_loop_that_keeps_every_batch_gets_the_ring_error_over_shared_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (data, a, _b, trust) = two_workers(dir.path());
    let l = builder(&data, dir.path(), &trust)
        .workers([a.addr.clone()])
        .ring_batches(4)
        .build()
        .unwrap();
    assert!(l.batches_per_epoch() > 8, "the epoch must outlast the ring");
    let mut kept = Vec::new();
    let mut error = None;
    for batch in l.epoch(0).unwrap() {
        match batch {
            Ok(b) => kept.push(b),
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    let error = error.expect("a consumer keeping every batch was never stopped");
    assert!(error.contains("holds all 4 ring buffers"), "{error}");
    assert_eq!(kept.len(), 4, "it held {} batches", kept.len());
    // Let go of them, and the next epoch runs whole.
    drop(kept);
    let n = l.epoch(1).unwrap().map(|b| b.unwrap().len()).sum::<usize>();
    assert_eq!(n as u64, planned(&data.manifest, 3, 1, 0, 1).len() as u64);
}
