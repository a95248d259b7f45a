//! The loader end to end with a decoder in process whose tensors are one byte (the sample's
//! index): early epochs, peeks, checkpoints (today's and those older builds wrote), settings.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_shard::{Checksum, Compression, ShardInfo};

use sluice_wire::{JobSpec, UnitRunner};

use super::*;
use crate::batch::{Batch, HeapAllocator, HostAllocator};
use crate::config::Order;
use sluice_plan::{LastBatch, Remainder, ShufflePolicy};

/// A worker in process whose tensors are one byte, the sample's index; it logs the epoch
/// of every unit it runs.
struct Tiny {
    runs: Arc<Mutex<Vec<u64>>>,
    /// An epoch whose first job is refused.
    refuse: Mutex<Option<u64>>,
}

struct TinyJob {
    epoch: u64,
    runs: Arc<Mutex<Vec<u64>>>,
}

const TINY: sluice_wire::SampleShape = sluice_wire::SampleShape::image_u8(1, 1, 1);

impl UnitRunner for Tiny {
    fn open_job(
        &self,
        spec: &JobSpec,
    ) -> Result<Box<dyn sluice_wire::JobRunner>, sluice_wire::RunnerError> {
        let mut refuse = self.refuse.lock().unwrap();
        if *refuse == Some(spec.epoch) {
            *refuse = None;
            return Err(sluice_wire::RunnerError::refused("not now"));
        }
        Ok(Box::new(TinyJob {
            epoch: spec.epoch,
            runs: self.runs.clone(),
        }))
    }
    fn threads(&self) -> u32 {
        1
    }
}

impl sluice_wire::JobRunner for TinyJob {
    fn shape(&self) -> sluice_wire::SampleShape {
        TINY
    }
    fn run(
        &self,
        a: &sluice_wire::Assign,
        emit: &mut dyn FnMut(sluice_wire::Output) -> bool,
    ) -> Result<sluice_wire::Finished, sluice_wire::RunnerError> {
        self.runs.lock().unwrap().push(self.epoch);
        crate::testing::emit_unit(a, emit, |index| (0, vec![index as u8]))
    }
}

/// Counts the buffers it makes.
struct Counting(Arc<std::sync::atomic::AtomicUsize>);

impl HostAllocator for Counting {
    fn allocate(&self, bytes: usize) -> Result<Box<dyn crate::batch::HostMemory>, String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        HeapAllocator.allocate(bytes)
    }
}

type Tiniest = (
    Loader,
    Arc<Mutex<Vec<u64>>>,
    Arc<std::sync::atomic::AtomicUsize>,
);

/// Shards `file:///tiny-{i}.tar` of these sample counts (never opened: [`Tiny`] makes the
/// samples).
fn tiny_manifest(samples: &[u64]) -> Manifest {
    Manifest::new(
        samples
            .iter()
            .enumerate()
            .map(|(i, &samples)| ShardInfo {
                url: format!("file:///tiny-{i}.tar"),
                size: 1 << 20,
                samples,
                checksum: Checksum(0),
                compression: Compression::None,
                replicas: Vec::new(),
            })
            .collect(),
    )
}

impl Tiny {
    /// A worker whose runs nobody looks at and that refuses nothing.
    fn idle() -> Arc<Self> {
        Arc::new(Tiny {
            runs: Arc::default(),
            refuse: Mutex::new(None),
        })
    }
}

fn tiny_loader(prefetch: bool) -> Tiniest {
    tiny_loader_refusing(prefetch, None)
}

/// A loader of 400 one-byte samples decoded by [`Tiny`], the log of its runs, and the
/// count of ring buffers it made.
fn tiny_loader_refusing(prefetch: bool, refuse: Option<u64>) -> Tiniest {
    let manifest = tiny_manifest(&[100; 4]);
    let runs = Arc::new(Mutex::new(Vec::new()));
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let loader = Loader::builder()
        .dataset(manifest)
        .in_process(Arc::new(Tiny {
            runs: runs.clone(),
            refuse: Mutex::new(refuse),
        }))
        .batch_size(16)
        .max_unit_samples(20)
        .lookahead(64)
        .ring_batches(2)
        .seed(5)
        .allocator(Arc::new(Counting(made.clone())))
        .prefetch_next_epoch(prefetch)
        .build()
        .unwrap();
    (loader, runs, made)
}

fn ids(epoch: Epoch) -> Vec<(u32, u64)> {
    read(epoch, Vec::new()).0
}

/// The epoch's sample ids, read as a Python loop reads it: `before` (batches of the epoch
/// before) is let go once the first batch has come, and the last batch is still held at
/// the end.
fn read(epoch: Epoch, mut before: Vec<Batch>) -> (Vec<(u32, u64)>, Vec<Batch>) {
    let mut ids = Vec::new();
    let mut last = Vec::new();
    let e = epoch.epoch();
    for b in epoch {
        let b = b.unwrap_or_else(|err| panic!("epoch {e} after {} samples: {err}", ids.len()));
        before.clear();
        ids.extend(b.ids().iter().map(|i| (i.shard, i.index)));
        last = vec![b];
    }
    (ids, last)
}

#[test]
fn the_next_epoch_starts_early_in_the_same_ring_and_delivers_the_same_batches() {
    let (plain, plain_runs, plain_made) = tiny_loader(false);
    let (early, runs, made) = tiny_loader(true);
    let mut held = Vec::new();
    let mut expected = Vec::new();
    for e in 0..3 {
        let (ids, last) = read(plain.epoch(e).unwrap(), held);
        expected.push(ids);
        held = last;
    }
    assert!(!plain_runs.lock().unwrap().is_empty());
    assert!(
        plain_made.load(std::sync::atomic::Ordering::Relaxed) > 2,
        "without an early start, each epoch makes its own ring"
    );
    let mut held = Vec::new();
    for (e, want) in expected.iter().enumerate() {
        let e = e as u64;
        let (got, last) = read(early.epoch(e).unwrap(), held);
        held = last;
        assert_eq!(&got, want, "epoch {e} started early differs");
        assert_eq!(got.len(), 400);
        // The epoch after this one started without being asked for.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !runs.lock().unwrap().contains(&(e + 1)) {
            assert!(
                Instant::now() < deadline,
                "epoch {} never started early",
                e + 1
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(
        made.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "epochs started early share the ring (2 buffers)"
    );
    drop(held);
    // A consumer that keeps every buffer of the ring from the epoch before still gets the
    // next one: the shared ring grows (up to twice its size, what a ring of its own costs).
    let mut kept = Vec::new();
    for b in early.epoch(3).unwrap() {
        kept.push(b.unwrap());
        if kept.len() > 2 {
            kept.remove(0);
        }
    }
    let (got, _) = read(early.epoch(4).unwrap(), Vec::new());
    drop(kept);
    assert_eq!(got, ids(plain.epoch(4).unwrap()));
    // Another epoch than the next one: the early one is dropped, this one is as planned.
    assert_eq!(ids(early.epoch(7).unwrap()), ids(plain.epoch(7).unwrap()));
    // A loaded checkpoint is resumed, not the epoch started early.
    let mut partial = early.epoch(8).unwrap();
    let first = partial.next().unwrap().unwrap();
    let firsts: Vec<_> = first.ids().iter().map(|i| (i.shard, i.index)).collect();
    drop(first);
    let checkpoint = early.state_dict().unwrap();
    drop(partial);
    let (fresh, _, _) = tiny_loader(true);
    fresh.load_state_dict(checkpoint).unwrap();
    let rest = ids(fresh.epoch(8).unwrap());
    let whole = ids(plain.epoch(8).unwrap());
    assert_eq!([firsts, rest].concat(), whole);
}

#[test]
fn an_epoch_read_again_starts_nothing_early() {
    let (l, _, _) = tiny_loader(true);
    let first = ids(l.epoch(3).unwrap());
    assert!(l.next.lock().unwrap().is_some(), "epoch 4 started early");
    let again = l.epoch(3).unwrap();
    assert!(
        l.next.lock().unwrap().is_none(),
        "epoch 3 again: epoch 4 is not started (an evaluation loop would waste it)"
    );
    assert_eq!(ids(again), first);
    let next = l.epoch(4).unwrap();
    assert!(
        l.next.lock().unwrap().is_some(),
        "in order again: epoch 5 is"
    );
    drop(next);
}

#[test]
fn an_early_epoch_that_failed_is_started_anew_when_asked_for() {
    let (plain, _, _) = tiny_loader(false);
    let (early, _, _) = tiny_loader_refusing(true, Some(1));
    assert_eq!(ids(early.epoch(0).unwrap()), ids(plain.epoch(0).unwrap()));
    // Epoch 1, started early, was refused; asked for, it starts again and succeeds.
    let failed = || {
        let next = early.next.lock().unwrap();
        let e = next.as_ref().unwrap();
        e.started.epoch.counters.failed.load(Ordering::Relaxed)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !failed() {
        assert!(Instant::now() < deadline, "the refusal never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(ids(early.epoch(1).unwrap()), ids(plain.epoch(1).unwrap()));
}

#[test]
fn connections_and_io_threads_are_bounded_and_named_in_the_error() {
    let manifest = tiny_manifest(&[64]);
    let builder = || {
        Loader::builder()
            .dataset(manifest.clone())
            .workers(["127.0.0.1:7100"])
            .trust_cert("/nonexistent/cert.pem")
    };
    type Set = fn(LoaderBuilder, u32) -> LoaderBuilder;
    let cases: [(&str, Set); 2] = [
        ("connections_per_worker", |b, n| b.connections_per_worker(n)),
        ("io_threads", |b, n| b.io_threads(n as usize)),
    ];
    for (name, set) in cases {
        // io_threads 0 is the loader's choice (`runtime_threads_follow_the_workers`).
        let out = if name == "io_threads" {
            &[17][..]
        } else {
            &[0, 17][..]
        };
        for &n in out {
            match set(builder(), n).build() {
                Err(ClientError::Config { key, .. }) => assert_eq!(key, name),
                Err(e) => panic!("{name} {n}: {e}"),
                Ok(_) => panic!("{name} {n} was accepted"),
            }
        }
    }
}

/// A pass of the epoch begun while the training pass is read (a peek) is not
/// checkpointed: the checkpoint is still the training pass's batches, and it resumes to
/// exactly the rest of the epoch. A peek before the training pass starts leaves nothing.
#[test]
fn a_peek_does_not_spoil_the_checkpoint() {
    let (loader, _, _) = tiny_loader(false);
    let all = ids(loader.epoch(0).unwrap());
    // Peeked before the pass, and dropped (as `next(iter(loader))` is).
    let peeked = loader.epoch(0).unwrap().next().unwrap().unwrap();
    drop(peeked);
    let mut train = loader.epoch(0).unwrap();
    let mut seen = Vec::new();
    for i in 0..6 {
        let b = train.next().unwrap().unwrap();
        seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
        drop(b);
        if i == 2 {
            // Peeked in the middle, and kept while the pass goes on.
            let mut peek = loader.epoch(0).unwrap();
            let first = peek.next().unwrap().unwrap();
            assert_eq!(first.ids()[0], all_first(&all));
            let state = loader.state_dict().unwrap();
            assert_eq!(state.batches, 3, "the peek was checkpointed");
            drop(first);
            let b = train.next().unwrap().unwrap();
            seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
            drop(peek);
        }
    }
    let state = loader.state_dict().unwrap();
    assert_eq!(state.batches, 7);
    drop(train);
    let (resumed, _, _) = tiny_loader(false);
    resumed.load_state_dict(state).unwrap();
    let rest = ids(resumed.epoch(0).unwrap());
    seen.extend(rest);
    assert_eq!(seen, all, "the resumed epoch is not exactly the rest");
}

/// Lightning and Accelerate save rank 0's state only: in plan order it resumes every rank
/// at its own place, exactly the rest of what that rank would have been handed; in arrival
/// order it is refused, naming the fix.
#[test]
fn one_ranks_checkpoint_resumes_every_rank() {
    let manifest = tiny_manifest(&[37, 41, 29, 53]);
    let builder = |rank: u32, order: Order| {
        Loader::builder()
            .dataset(manifest.clone())
            .in_process(Tiny::idle())
            .batch_size(8)
            .max_unit_samples(9)
            .seed(11)
            .rank(rank)
            .world_size(2)
            .order(order)
            .prefetch_next_epoch(false)
    };
    let mut state0 = None;
    for rank in 0..2 {
        let loader = builder(rank, Order::Plan).build().unwrap();
        let all = ids(loader.epoch(1).unwrap());
        let mut epoch = loader.epoch(1).unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let b = epoch.next().unwrap().unwrap();
            seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
        }
        if rank == 0 {
            state0 = loader.state_dict();
        }
        drop(epoch);
        let resumed = builder(rank, Order::Plan).build().unwrap();
        let state = state0.clone().unwrap();
        assert_eq!(state.rank, 0);
        resumed.load_state_dict(state).unwrap();
        seen.extend(ids(resumed.epoch(1).unwrap()));
        assert_eq!(seen, all, "rank {rank} did not resume exactly the rest");
    }
    let arrival = builder(1, Order::Arrival).build().unwrap();
    let mut state = state0.unwrap();
    state.order = Order::Arrival;
    let err = arrival.load_state_dict(state).unwrap_err().to_string();
    assert!(err.contains("save every rank's state_dict"), "{err}");
}

fn all_first(all: &[(u32, u64)]) -> crate::batch::SampleId {
    crate::batch::SampleId {
        shard: all[0].0,
        index: all[0].1,
    }
}

/// `none`: manifest order, whatever the mixing asked for; arrival order is refused.
#[test]
fn shuffle_none_delivers_the_manifest_in_order() {
    let manifest = tiny_manifest(&[25, 26, 27, 28]);
    let builder = |rank: u32| {
        Loader::builder()
            .dataset(manifest.clone())
            .in_process(Tiny::idle())
            .batch_size(8)
            .max_unit_samples(7)
            .shuffle(ShufflePolicy::Sequential)
            .remainder(Remainder::Pad)
            .last_batch(LastBatch::Partial)
            .world_size(3)
            .rank(rank)
    };
    let in_order: Vec<(u32, u64)> = (0..4u32)
        .flat_map(|s| (0..25 + u64::from(s)).map(move |i| (s, i)))
        .collect();
    let mut real = Vec::new();
    for rank in 0..3 {
        let loader = builder(rank).seed(u64::from(rank) + 9).build().unwrap();
        for e in 0..2 {
            let mut got = Vec::new();
            for b in loader.epoch(e).unwrap() {
                let b = b.unwrap();
                for (id, pad) in b.ids().iter().zip(b.padding()) {
                    if !pad {
                        got.push((id.shard, id.index));
                    }
                }
            }
            if e == 0 {
                real.extend(got.clone());
            } else {
                assert_eq!(&real[real.len() - got.len()..], &got[..], "epoch 1 differs");
            }
        }
    }
    assert_eq!(real, in_order);
    match builder(0).order(Order::Arrival).build() {
        Err(ClientError::Config { key, .. }) => assert_eq!(key, "order"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("arrival order was accepted with shuffle none"),
    }
}

/// A pipeline workers would refuse is refused when the loader is built, named.
#[test]
fn a_pipeline_workers_would_refuse_is_a_config_error() {
    for (pipeline, says) in [
        ("decode | hflip 2.0", "hflip"),
        ("decode | resize 40", "output size is not fixed"),
        ("decode | resize 16384x16384", "largest frame"),
    ] {
        let built = Loader::builder()
            .dataset(tiny_manifest(&[64]))
            .in_process(Tiny::idle())
            .pipeline(pipeline.to_string())
            .build();
        match built {
            Err(ClientError::Config { key, detail }) => {
                assert_eq!(key, "pipeline");
                assert!(detail.contains(says), "{pipeline}: {detail}");
            }
            Err(e) => panic!("{pipeline}: {e}"),
            Ok(_) => panic!("{pipeline} was accepted"),
        }
    }
}

/// A checkpoint names the dataset by its shards' content, not their URLs: it resumes on
/// the same shards served from elsewhere (another directory, a storage node), and a
/// changed shard is named in the refusal.
#[test]
fn checkpoints_follow_the_shards_content_not_their_urls() {
    let manifest = |base: &str, checksum_of_2: u64| {
        Manifest::new(
            (0..4)
                .map(|i| ShardInfo {
                    url: format!("{base}/tiny-{i}.tar"),
                    size: 1 << 20,
                    samples: 100,
                    checksum: Checksum(if i == 2 { checksum_of_2 } else { i }),
                    compression: Compression::None,
                    replicas: Vec::new(),
                })
                .collect(),
        )
    };
    let loader = |m: Manifest| {
        Loader::builder()
            .dataset(m)
            .in_process(Tiny::idle())
            .batch_size(16)
            .seed(5)
            .build()
            .unwrap()
    };
    let first = loader(manifest("file:///data", 2));
    let mut epoch = first.epoch(0).unwrap();
    let mut before: Vec<(u32, u64)> = Vec::new();
    for _ in 0..3 {
        let b = epoch.next().unwrap().unwrap();
        before.extend(b.ids().iter().map(|i| (i.shard, i.index)));
    }
    let state = first.state_dict().unwrap();
    assert_eq!(state.shards.len(), 4);
    drop(epoch);

    let moved = loader(manifest("http://storage-7:7000/v1/train", 2));
    moved.load_state_dict(state.clone()).unwrap();
    let rest = ids(moved.epoch(0).unwrap());
    let mut all: Vec<_> = before.iter().chain(&rest).copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        (before.len() + rest.len(), all.len()),
        (400, 400),
        "exactly the rest"
    );

    let changed = loader(manifest("file:///data", 99));
    let err = changed.load_state_dict(state).unwrap_err().to_string();
    assert!(err.contains("shard #2 (file:///data/tiny-2.tar)"), "{err}");
}

/// Any batch size works in plan order with the default lookahead (it was a fixed 512, so
/// `--batch-size 513` failed); one set explicitly below the batch size is still refused.
#[test]
fn the_default_lookahead_follows_the_batch_size() {
    let manifest = Manifest::new(vec![ShardInfo {
        url: "file:///nowhere.tar".into(),
        size: 1 << 30,
        samples: 4096,
        checksum: Checksum(0),
        compression: Compression::None,
        replicas: Vec::new(),
    }]);
    let tiny = Tiny::idle();
    let build = |batch: u32, lookahead: Option<u64>| {
        let b = Loader::builder()
            .dataset(manifest.clone())
            .in_process(tiny.clone())
            .batch_size(batch);
        match lookahead {
            Some(l) => b.lookahead(l),
            None => b,
        }
        .build()
    };
    for batch in [1, 256, 513, 2048] {
        let loader = build(batch, None).unwrap_or_else(|e| panic!("batch {batch}: {e}"));
        assert_eq!(loader.config.lookahead, 512.max(2 * u64::from(batch)));
    }
    match build(513, Some(100)) {
        Err(ClientError::Config { key, .. }) => assert_eq!(key, "lookahead"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a lookahead under the batch size was accepted"),
    }
}

/// Checkpoints written before `LoaderConfig` (version 2: the plan settings as text), one at
/// the world size it was taken at and one of an epoch resumed at another world size, resume
/// exactly the rest those builds delivered.
#[test]
fn checkpoints_older_builds_wrote_resume_exactly() {
    let fixture: serde_json::Value = serde_json::from_str(include_str!(
        "../../tests/fixtures/checkpoints-31b71bb.json"
    ))
    .unwrap();
    let manifest = tiny_manifest(&[37, 41, 29, 53]);
    for case in ["same_world", "new_world"] {
        let case = &fixture[case];
        let state = serde_json::to_vec(&case["state"]).unwrap();
        let state = Checkpoint::from_bytes(&state).unwrap();
        assert_eq!(state.version, 2);
        assert!(matches!(&state.plan, PlanRecord::Text(t) if t.contains("remainder=Drop")));
        let rest: Vec<(u32, u64)> = serde_json::from_value(case["rest"].clone()).unwrap();
        // The settings the fixture was written with (unit size 9), and another unit size.
        let build = |unit: u64| {
            Loader::builder()
                .dataset(manifest.clone())
                .in_process(Tiny::idle())
                .batch_size(8)
                .max_unit_samples(unit)
                .seed(11)
                .rank(case["rank"].as_u64().unwrap() as u32)
                .world_size(case["world_size"].as_u64().unwrap() as u32)
                .prefetch_next_epoch(false)
                .build()
                .unwrap()
        };
        let loader = build(9);
        loader.load_state_dict(state.clone()).unwrap();
        assert_eq!(ids(loader.epoch(1).unwrap()), rest, "{case}");
        // Another unit size is named, in the old text's words.
        let err = build(10).load_state_dict(state).unwrap_err().to_string();
        assert!(err.contains("plan settings remainder=Drop unit=9"), "{err}");
    }
}

/// Today's checkpoints record the plan settings typed, and a mismatch names the setting.
#[test]
fn a_checkpoint_names_the_plan_setting_that_differs() {
    let (loader, _, _) = tiny_loader(false);
    let mut epoch = loader.epoch(0).unwrap();
    epoch.next().unwrap().unwrap();
    let state = loader.state_dict().unwrap();
    drop(epoch);
    assert_eq!(state.version, Checkpoint::VERSION);
    let text = String::from_utf8(state.to_bytes()).unwrap();
    assert!(
        text.contains(r#""plan":{"remainder":"drop","max_unit_samples":20"#),
        "{text}"
    );
    let other = Loader::builder()
        .dataset(tiny_manifest(&[100; 4]))
        .in_process(Tiny::idle())
        .batch_size(16)
        .max_unit_samples(20)
        .lookahead(64)
        .seed(5)
        .last_batch(crate::batch::LastBatch::Drop)
        .build()
        .unwrap();
    let err = other.load_state_dict(state).unwrap_err().to_string();
    assert!(
        err.contains("last_batch Partial, this loader has Drop"),
        "{err}"
    );
}

#[test]
fn a_state_taken_at_an_epochs_end_resumes_the_next_epoch_and_restart_forgets_it() {
    let (plain, _, _) = tiny_loader(false);
    let (l, _, _) = tiny_loader(false);
    // Every batch of epoch 2 handed out, the stream not yet asked for more (as Lightning).
    let mut e = l.epoch(2).unwrap();
    for _ in 0..l.batches_per_epoch() {
        drop(e.next().unwrap().unwrap());
    }
    let end = l.state_dict().unwrap();
    drop(e);
    let (fresh, _, _) = tiny_loader(false);
    assert_eq!(fresh.load_state_dict(end.clone()).unwrap(), 3);
    assert_eq!(
        fresh.state_dict(),
        Some(end),
        "until the next epoch, the state loaded"
    );
    assert_eq!(ids(fresh.epoch(3).unwrap()), ids(plain.epoch(3).unwrap()));
    // A mid-epoch state resumes its own epoch; restart() forgets it.
    let mut e = l.epoch(5).unwrap();
    drop(e.next().unwrap().unwrap());
    let mid = l.state_dict().unwrap();
    drop(e);
    assert_eq!(fresh.load_state_dict(mid).unwrap(), 5);
    fresh.restart();
    assert_eq!(fresh.state_dict(), None);
    assert_eq!(ids(fresh.epoch(5).unwrap()), ids(plain.epoch(5).unwrap()));
}
