//! A seeded simulation of the coordinator against many simulated workers: random delays
//! and interleaving, workers that die and come back (a new connection generation), frames of
//! a dead connection read late, duplicates, decoder skips, and workers that stall on a unit
//! until silence detection gives up on them. Time is tokio's paused clock, so hedging and
//! silence deadlines pass in simulated seconds and a run takes milliseconds. The pool changes
//! as it runs: workers join (a new link, as a workers file or DNS adds one) and leave (drained:
//! a worker that left must get nothing new, and is released only with nothing open).
//!
//! Half the plan-order seeds share a batch arena with their workers (as same-host ones do):
//! workers write the samples they were given places for straight into the batches, and a
//! worker declared lost may be a stalled process that lives on and writes its places later,
//! at any moment, with garbage; one that was killed writes nothing more.
//!
//! Every run checks, from the batches alone: every planned sample exactly once (delivered or
//! skipped), in the plan's order, in the planned number of batches, with intact tensors (also
//! after the consumer held the batch a while: nothing writes a batch it holds); and the
//! reorder area within its bound. A quarter of the seeds run in arrival order, where only
//! exactly-once and the batch count are promised. `SLUICE_SIM_SEEDS` sets the number of seeds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_plan::rng::{stream, Domain, Stream};
use sluice_wire::{Assign, UnitDone};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Coordinator;
use crate::arena::Arena;
use crate::batch::HeapAllocator;
use crate::link::Event;
use crate::protocol::world::{bad, decoded, rejected, seeds, tensor, world, World, SHAPE};
use crate::same_host::{ArenaPlan, Payload, Segments};
use crate::session::Command;
use crate::stats::{EpochCounters, Stats};

struct SimLink {
    commands: mpsc::Receiver<Command>,
    generation: u64,
    alive: bool,
    credits: u32,
    /// Open pieces: the assignment and its next index.
    open: Vec<(Assign, u64)>,
    /// This connection went silent (alive, sending nothing) at `since`.
    stalled: bool,
    since: tokio::time::Instant,
    sent_any: bool,
    /// The worker announces a shard cache (the client then dispatches by shard affinity).
    caches: bool,
    /// It left the pool (the coordinator was told), and was then released (its command queue
    /// closed).
    left: bool,
    released: bool,
    /// With a batch arena: the connection's writer there and the places it was given.
    writer: u64,
    places: HashMap<(u64, u32, u64), u32>,
    /// Places of its lost connections whose process lives on: it may write them any time.
    zombie: Vec<u32>,
}

/// Most links a simulated epoch grows to.
const MAX_LINKS: usize = 8;

impl SimLink {
    fn new(commands: mpsc::Receiver<Command>, caches: bool) -> Self {
        SimLink {
            commands,
            generation: 0,
            alive: false,
            credits: 0,
            open: Vec::new(),
            stalled: false,
            since: tokio::time::Instant::now(),
            sent_any: false,
            caches,
            left: false,
            released: false,
            writer: 0,
            places: HashMap::new(),
            zombie: Vec::new(),
        }
    }
}

/// What became of a simulated epoch's pool: links that joined, left, and were released
/// before the epoch ended; with a batch arena, samples written into their places, and places
/// written by lost workers that lived on.
#[derive(Default)]
struct PoolChanges {
    joined: usize,
    left: usize,
    released: usize,
    placed: usize,
    zombie_writes: usize,
}

/// The batch arena of a simulated epoch, if it has one, and what its workers did with it.
struct Shared {
    arena: Option<Arc<Arena>>,
    placed: usize,
    zombie_writes: usize,
}

/// One simulated epoch: the batches' ids, the epoch's report and its pool's changes.
async fn simulate(
    seed: u64,
    world: &World,
) -> (Vec<Vec<(u32, u64)>>, crate::stats::EpochReport, PoolChanges) {
    let mut rng = stream(seed, Domain::Sample, 0, 1);
    let links = 1 + rng.below(4) as usize;
    let counters = Arc::new(EpochCounters::default());
    let mut senders = Vec::new();
    let mut sims = Vec::new();
    for _ in 0..links {
        let (tx, rx) = mpsc::channel(1024);
        senders.push(tx);
        sims.push(SimLink::new(rx, world.caches));
    }
    let names: Vec<(String, mpsc::Sender<Command>)> = senders
        .into_iter()
        .enumerate()
        .map(|(i, tx)| (format!("w{i}"), tx))
        .collect();
    let ring_batches = 2 + rng.below(3) as usize;
    let settings = world.settings(&mut rng, 1, ring_batches);
    let segments = (!world.arrival && seed % 2 == 0).then(|| {
        let plan = ArenaPlan {
            ring: ring_batches as u32,
            waiting: settings.config.waiting_bound(),
            batch: world.batch_plan.batch_size as u32,
        };
        Arc::new(Segments::new(1, Some((plan, Arc::new(HeapAllocator)))))
    });
    let mut coordinator = Coordinator::new(
        settings,
        world.manifest.clone(),
        world.order(seed),
        names,
        Arc::new(HeapAllocator),
        counters.clone(),
        Arc::new(Stats::new()),
    );
    if let Some(s) = &segments {
        coordinator = coordinator.with_arena(s.clone());
    }
    // Made as a same-host link makes it, before the coordinator looks for it.
    let mut shared = Shared {
        arena: segments.and_then(|s| s.arena(SHAPE.bytes())),
        placed: 0,
        zombie_writes: 0,
    };
    let (events, events_rx) = mpsc::channel(4096);
    let (out_tx, mut out_rx) = mpsc::channel(4);
    let task = tokio::spawn(coordinator.run(events_rx, out_tx, CancellationToken::new()));
    // The consumer, holding each batch a random moment.
    let mut consumer_rng = stream(seed, Domain::Sample, 0, 2);
    let consumer = tokio::spawn(async move {
        let mut got = Vec::new();
        let intact = |batch: &crate::batch::Batch, when: &str| {
            for (k, id) in batch.ids().iter().enumerate() {
                let t = &batch.images()[k * 4..k * 4 + 4];
                assert_eq!(t, tensor(id.shard, id.index), "tensor of {id:?} {when}");
            }
        };
        while let Some(batch) = out_rx.recv().await {
            let batch = batch.expect("the epoch failed");
            intact(&batch, "as delivered");
            got.push(batch.ids().iter().map(|i| (i.shard, i.index)).collect());
            let hold = consumer_rng.below(5);
            tokio::time::sleep(Duration::from_millis(hold)).await;
            intact(&batch, "after the consumer held it");
        }
        got
    });
    let mut late: Vec<Event> = Vec::new();
    while !consumer.is_finished() {
        step(
            &mut sims,
            &mut rng,
            (&events, &mut shared),
            &mut late,
            task.is_finished(),
        )
        .await;
        change_pool(&mut sims, &mut rng, &events).await;
        tokio::time::sleep(Duration::from_millis(rng.below(3))).await;
    }
    let got = consumer.await.expect("consumer");
    task.await.expect("coordinator");
    let changes = PoolChanges {
        joined: sims.len() - links,
        left: sims.iter().filter(|l| l.left).count(),
        released: sims.iter().filter(|l| l.released).count(),
        placed: shared.placed,
        zombie_writes: shared.zombie_writes,
    };
    (got, counters.report(0, 0), changes)
}

/// Now and then a worker joins the pool, or one leaves it (never the last one in it).
async fn change_pool(sims: &mut Vec<SimLink>, rng: &mut Stream, events: &mpsc::Sender<Event>) {
    match rng.below(600) {
        0 if sims.len() < MAX_LINKS => {
            let (tx, rx) = mpsc::channel(1024);
            let link = sims.len();
            let caches = sims[0].caches;
            sims.push(SimLink::new(rx, caches));
            let joined = Event::Joined {
                link,
                name: format!("w{link}"),
                commands: tx,
            };
            let _ = events.send(joined).await;
        }
        1 if sims.iter().filter(|l| !l.left).count() > 1 => {
            let staying: Vec<usize> = (0..sims.len()).filter(|&i| !sims[i].left).collect();
            let link = staying[rng.below(staying.len() as u64) as usize];
            sims[link].left = true;
            let _ = events.send(Event::Left { link }).await;
        }
        _ => {}
    }
}

/// One random step of the simulated workers.
async fn step(
    sims: &mut [SimLink],
    rng: &mut Stream,
    (events, shared): (&mpsc::Sender<Event>, &mut Shared),
    late: &mut Vec<Event>,
    ended: bool,
) {
    let now = tokio::time::Instant::now();
    let arena = shared.arena.clone();
    // A lost worker that lives on writes one of its places, whenever.
    if let Some(a) = &arena {
        let i = rng.below(sims.len() as u64) as usize;
        if !sims[i].zombie.is_empty() && rng.below(8) == 0 {
            let place = sims[i].zombie.swap_remove(0);
            a.segment().write(place, &[0xEE; 4]).expect("a place");
            shared.zombie_writes += 1;
        }
    }
    for (i, l) in sims.iter_mut().enumerate() {
        loop {
            let c = match l.commands.try_recv() {
                Ok(c) => c,
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    // Released: only a worker that left, and only once it holds nothing
                    // (at the epoch's end every link is).
                    if !l.released && !ended {
                        assert!(l.left, "link {i} released without leaving the pool");
                        assert!(l.open.is_empty(), "link {i} released holding {:?}", l.open);
                        l.released = true;
                        l.alive = false;
                    }
                    break;
                }
            };
            match c {
                Command::Credit(g, n) if g == l.generation && l.alive => l.credits += n,
                Command::Assign(g, a) if g == l.generation && l.alive => {
                    let start = a.start;
                    l.open.push((a, start));
                }
                // Owned by this connection as the real link sends them (a grant dropped here
                // gives its places back).
                Command::Places(g, grant) if g == l.generation && l.alive => {
                    let handed = arena.as_ref().and_then(|a| grant.hand(a, l.writer));
                    for p in handed.expect("places only with an arena") {
                        l.places.insert((p.unit, p.attempt, p.index), p.place);
                    }
                }
                _ => {} // meant for a connection that is gone
            }
        }
        // Silence detection: a stalled connection is declared lost after 10 s.
        if l.alive && l.stalled && now - l.since > Duration::from_secs(10) {
            let killed = rng.below(2) == 0;
            lose(i, l, (events, arena.as_deref(), killed)).await;
        }
    }
    // A late frame of a dead connection, read after its loss.
    if !late.is_empty() && rng.below(4) == 0 {
        let e = late.swap_remove(rng.below(late.len() as u64) as usize);
        let _ = events.send(e).await;
    }
    let several = sims.len() > 1;
    let i = rng.below(sims.len() as u64) as usize;
    let l = &mut sims[i];
    if l.released {
        return;
    }
    if !l.alive {
        // A worker that left the pool is not dialed again.
        if !l.left && rng.below(3) == 0 {
            l.generation += 1;
            if let Some(a) = &arena {
                l.writer = a.writer();
            }
            l.alive = true;
            l.stalled = false;
            l.credits = 0;
            l.since = now;
            let ready = Event::Ready {
                link: i,
                generation: l.generation,
                shape: SHAPE,
                caches: l.caches,
            };
            let _ = events.send(ready).await;
        }
        return;
    }
    match rng.below(400) {
        0 if several => {
            let killed = rng.below(2) == 0;
            return lose(i, l, (events, arena.as_deref(), killed)).await;
        }
        1 if several && l.sent_any => {
            // Goes silent on everything it holds; silence detection must notice.
            l.stalled = true;
            l.since = now;
            return;
        }
        _ => {}
    }
    if l.stalled || l.open.is_empty() || l.credits == 0 {
        return;
    }
    let p = rng.below(l.open.len() as u64) as usize;
    let (a, next) = &mut l.open[p];
    let (shard, index) = (a.shard.index, *next);
    *next += 1;
    let skipped = bad(shard, index);
    let key = (a.unit, a.attempt, index);
    let place = l.places.remove(&key);
    let event = if skipped {
        if let Some(ar) = &arena {
            ar.answered(l.writer, key);
        }
        Event::Skipped {
            skipped: rejected(a, index),
        }
    } else {
        l.credits -= 1;
        l.sent_any = true;
        match (place, &arena) {
            // Written into its batch, then answered (the link settles it as it reads).
            (Some(place), Some(ar)) => {
                ar.segment()
                    .write(place, &tensor(shard, index))
                    .expect("a place");
                ar.placed(l.writer, place, key).expect("its own place");
                shared.placed += 1;
                // A placed sample spends no credit: the worker keeps the one it took.
                l.credits += 1;
                Event::Sample {
                    link: i,
                    header: decoded(a, index),
                    payload: Payload::Placed {
                        arena: ar.clone(),
                        place,
                    },
                    fields: Default::default(),
                }
            }
            _ => {
                if let Some(ar) = &arena {
                    ar.answered(l.writer, key);
                }
                sample_event(i, a, index)
            }
        }
    };
    // Now and then a copy of the frame arrives again (a retransmission, a hedge's twin).
    if !skipped && rng.below(50) == 0 {
        late.push(sample_event(i, a, index));
    }
    let done = (*next == a.end).then(|| UnitDone {
        job: 1,
        unit: a.unit,
        attempt: a.attempt,
        sent: a.end - a.start,
        skipped: 0,
        storage_bytes: 0,
        cached_bytes: 0,
    });
    let _ = events.send(event).await;
    if let Some(done) = done {
        let (_, attempt) = (l.open.swap_remove(p), done.attempt);
        if let Some(ar) = &arena {
            ar.unit_ended(l.writer, done.unit, attempt);
            l.places
                .retain(|(u, t, _), _| (*u, *t) != (done.unit, attempt));
        }
        let _ = events.send(Event::UnitDone { link: i, done }).await;
    }
}

/// The frame of sample `index` of assignment `a`, as link `link` sends it.
fn sample_event(link: usize, a: &Assign, index: u64) -> Event {
    let shard = a.shard.index;
    Event::Sample {
        link,
        header: decoded(a, index),
        payload: Payload::Bytes(tensor(shard, index).into()),
        fields: Default::default(),
    }
}

/// Link `i`'s connection is declared lost: its worker was `killed` (its process exited: its
/// places are settled), or lives on, stalled, and may write its places later.
async fn lose(
    i: usize,
    l: &mut SimLink,
    (events, arena, killed): (&mpsc::Sender<Event>, Option<&Arena>, bool),
) {
    if let Some(a) = arena {
        if killed {
            a.released(l.writer);
        } else {
            l.zombie.extend(l.places.values());
        }
        a.writer_ended(l.writer, None);
        l.places.clear();
    }
    l.alive = false;
    l.open.clear();
    l.credits = 0;
    let lost = Event::Lost {
        link: i,
        generation: l.generation,
        error: "simulated loss".into(),
        fatal: None,
    };
    let _ = events.send(lost).await;
}

#[test]
fn many_seeds_of_failures_keep_exactly_once_plan_order_and_bounds() {
    let seeds = seeds(3000);
    let (mut hedged, mut reassigned, mut duplicates) = (0, 0, 0);
    let mut pool = PoolChanges::default();
    let mut by_seed: HashMap<u64, u64> = HashMap::new();
    let first: u64 = std::env::var("SLUICE_SIM_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    for seed in first..first + seeds {
        let w = world(seed);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let (got, report, changes) = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(3600), simulate(seed, &w))
                .await
                .unwrap_or_else(|_| panic!("seed {seed}: the epoch never finished"))
        });
        let peak = w.check(&got, &report, &format!("seed {seed}"));
        hedged += report.hedged;
        reassigned += report.reassigned;
        duplicates += report.duplicates_dropped;
        by_seed.insert(seed, peak);
        pool.joined += changes.joined;
        pool.left += changes.left;
        pool.released += changes.released;
        pool.placed += changes.placed;
        pool.zombie_writes += changes.zombie_writes;
    }
    eprintln!(
        "{seeds} seeds: {hedged} hedged units, {reassigned} reassigned pieces, {duplicates} \
         duplicates dropped, largest reorder peak {}; {} workers joined, {} left ({} drained \
         and released before their epoch ended)",
        by_seed.values().max().copied().unwrap_or(0),
        pool.joined,
        pool.left,
        pool.released
    );
    // The simulation has teeth: stalls were hedged, losses reassigned, copies dropped, and
    // workers joined and left (and were drained) while epochs ran.
    assert!(hedged > 0 && reassigned > 0 && duplicates > 0);
    eprintln!(
        "{} samples written straight into their batches, {} places written by lost workers \
         that lived on",
        pool.placed, pool.zombie_writes
    );
    if seeds >= 1000 {
        assert!(pool.joined > 0 && pool.left > 0 && pool.released > 0);
        assert!(pool.placed > 0 && pool.zombie_writes > 0);
    }
}
