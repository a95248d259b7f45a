//! A unit's samples through the pool, met on one [`Hub`].
//!
//! Samples are read and parsed on a thread of their own (so decoding starts on the first
//! sample while the rest still arrives, and a slow read never holds up an outcome); the
//! unit's own thread both feeds the pool and hands each outcome to the sink. The two threads
//! and the pool's tasks meet under one lock, and each wakes another only when that one
//! waits for what it brings:
//! - a decoded sample wakes the unit's thread (its one wake-up a sample), which takes every
//!   outcome that is there and feeds the pool the room they left in one turn;
//! - the reader, ahead of the pool by a queue, is woken when half the queue has gone, not
//!   for every sample taken;
//! - a sample whose tensor another job of its sweep already decoded is copied out of the
//!   window on the unit's thread as it is fed ([`Engine::served_here`]): no task, no wake-up.
//!
//! Before, a reader, a feeder thread and the unit's thread passed each sample along two
//! channels and a condition variable, each step a wake-up, and on a worker whose cores are
//! all busy each wake-up preempts a decoder: `sluice bench chain` over same-host memory,
//! where the tiers share two cores, made 23.9k context switches a second (10 a sample), and
//! 18.8k (8 a sample) with the hub.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use sluice_shard::{Sample, ShardError};
use sluice_wire::Turn;

use super::{BadSamplePolicy, Engine, Outcome, PlaceTarget, SampleContext, UnitStats, TURN_POLL};
use crate::error::{DecodeError, EngineError, SampleError};

/// A sample to process (shared with the other units of a sweep that read it with this one:
/// `crate::source::ShardSource::open_unit_together`), or one the source found damaged
/// (reported as a skip).
type Input = Result<Arc<Sample>, SampleError>;

/// Where the reader, the pool's tasks and the unit's thread meet.
struct Hub {
    state: Mutex<State>,
    /// The unit's thread: an input or an outcome came, or the reader ended.
    ready: Condvar,
    /// The reader: the queue has room again, or the unit stopped.
    room: Condvar,
    /// Inputs the reader may parse ahead.
    bound: usize,
}

#[derive(Default)]
struct State {
    inputs: VecDeque<Input>,
    outcomes: Vec<Outcome>,
    /// The reader will put nothing more.
    read_ended: bool,
    /// The unit takes nothing more (cancelled, or failed): the reader stops.
    stopped: bool,
    /// Who waits now (wake only those).
    unit_waits: bool,
    reader_waits: bool,
}

impl Hub {
    fn new(bound: usize) -> Self {
        Hub {
            state: Mutex::default(),
            ready: Condvar::new(),
            room: Condvar::new(),
            bound: bound.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The reader's: `input` queued, once there is room; `false` once the unit stopped.
    fn put(&self, input: Input) -> bool {
        let mut s = self.lock();
        while s.inputs.len() >= self.bound && !s.stopped {
            s.reader_waits = true;
            s = self.room.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.stopped {
            return false;
        }
        s.inputs.push_back(input);
        if s.unit_waits {
            self.ready.notify_one();
        }
        true
    }

    /// The reader's, however it ends (a panic included): nothing more comes.
    fn read_ended(&self) {
        let mut s = self.lock();
        s.read_ended = true;
        if s.unit_waits {
            self.ready.notify_one();
        }
    }

    /// A pool task's: its sample's outcome.
    fn done(&self, outcome: Outcome) {
        let mut s = self.lock();
        s.outcomes.push(outcome);
        if s.unit_waits {
            self.ready.notify_one();
        }
    }

    /// The unit's: the reader stops at its next sample.
    fn stop(&self) {
        let mut s = self.lock();
        s.stopped = true;
        s.inputs.clear();
        self.room.notify_one();
    }

    /// The unit's thread waits until it has something to do: outcomes (all that are there),
    /// up to `room` inputs to feed (none while `turn` is paused), or the end (nothing in
    /// flight, and nothing more to feed).
    fn turn(&self, room: usize, in_flight: usize, turn: Option<&Turn>) -> Turned {
        let mut s = self.lock();
        loop {
            let waiting_input = room > 0 && !s.inputs.is_empty();
            let paused = waiting_input && turn.is_some_and(Turn::paused);
            let finished = in_flight == 0
                && s.outcomes.is_empty()
                && (room == 0 && s.stopped || s.read_ended && s.inputs.is_empty());
            if finished || !s.outcomes.is_empty() || (waiting_input && !paused) {
                let outcomes = std::mem::take(&mut s.outcomes);
                let feed = match waiting_input && !paused {
                    true => {
                        let n = room.min(s.inputs.len());
                        s.inputs.drain(..n).collect()
                    }
                    false => Vec::new(),
                };
                // The reader goes on once half its queue is gone, not at every sample.
                if s.reader_waits && s.inputs.len() <= self.bound / 2 {
                    s.reader_waits = false;
                    self.room.notify_one();
                }
                return Turned {
                    outcomes,
                    feed,
                    finished,
                };
            }
            if paused && in_flight == 0 {
                // Nothing will come but the unit's turn, which wakes its own waiters.
                drop(s);
                if let Some(t) = turn {
                    t.wait(TURN_POLL, || false);
                }
                s = self.lock();
                continue;
            }
            s.unit_waits = true;
            s = match paused {
                // Outcomes are due; the turn may come back before them.
                true => {
                    self.ready
                        .wait_timeout(s, TURN_POLL)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                false => self.ready.wait(s).unwrap_or_else(|e| e.into_inner()),
            };
            s.unit_waits = false;
        }
    }
}

/// Ends the reader's side when its thread leaves, however it leaves.
struct ReaderEnd<'a>(&'a Hub);

impl Drop for ReaderEnd<'_> {
    fn drop(&mut self) {
        self.0.read_ended();
    }
}

/// What the unit's thread takes in one turn.
struct Turned {
    outcomes: Vec<Outcome>,
    feed: Vec<Input>,
    /// Nothing is in flight and nothing more will be fed: the unit is over.
    finished: bool,
}

impl Engine {
    /// See [`Engine::run_unit_to`].
    pub(super) fn run_unit_on_hub<I, S>(
        &self,
        samples: I,
        ctx: &SampleContext,
        target: Option<&PlaceTarget>,
        turn: Option<&Turn>,
        mut sink: impl FnMut(Outcome) -> bool,
    ) -> Result<UnitStats, EngineError>
    where
        I: Iterator<Item = Result<S, ShardError>> + Send,
        S: Into<Arc<Sample>>,
    {
        let bound = self.config.readahead.max(1);
        let most = match turn {
            Some(_) => self.pool.current_num_threads().max(1).min(bound),
            None => bound,
        };
        let hub = Hub::new(bound);
        let mut tally = Tally::default();
        let read_error = std::thread::scope(|scope| {
            let hub = &hub;
            let times = &self.times;
            // The reader hands its samples back when it ends, to be dropped with the unit,
            // not before: a read shared with other units of a sweep
            // (`crate::source::ShardSource::open_unit_together`) stays joinable while any of
            // its units runs, not only while one is still reading (a reader runs ahead of
            // its unit, often to the unit's end at its start).
            let reader = scope.spawn(move || -> (Option<ShardError>, I) {
                let _end = ReaderEnd(hub);
                let mut samples = samples;
                let read_error = loop {
                    let t = Instant::now();
                    let next = samples.next();
                    times
                        .fetch_parse_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    let input = match next {
                        None => break None,
                        Some(Ok(s)) => Ok(s.into()),
                        Some(Err(ShardError::DamagedSample {
                            shard,
                            offset,
                            index,
                            key,
                            detail,
                        })) => Err(SampleError {
                            shard,
                            key,
                            index,
                            reason: DecodeError::Damaged(format!("{detail} (at byte {offset})")),
                        }),
                        Some(Err(e)) => break Some(e),
                    };
                    if !hub.put(input) {
                        break None;
                    }
                };
                (read_error, samples)
            });
            self.pool.in_place_scope(|tasks| {
                let mut in_flight = 0usize;
                loop {
                    let room = if tally.stopping { 0 } else { most - in_flight };
                    let turned = hub.turn(room, in_flight, turn);
                    if turned.finished {
                        break;
                    }
                    for outcome in turned.outcomes {
                        in_flight -= 1;
                        tally.take(outcome, self.config.policy, &mut sink);
                    }
                    let mut feed = turned.feed.into_iter();
                    for input in feed.by_ref() {
                        if tally.stopping {
                            break;
                        }
                        // A sample another job of its sweep decoded already is copied out
                        // here, not handed to the pool and back.
                        let key = match &input {
                            Ok(sample) => match self.served_here(sample, ctx, target) {
                                Ok(outcome) => {
                                    self.give_back(input);
                                    tally.take(outcome, self.config.policy, &mut sink);
                                    continue;
                                }
                                Err(key) => key,
                            },
                            Err(_) => None,
                        };
                        in_flight += 1;
                        tasks.spawn(move |_| {
                            let outcome = match input {
                                Ok(sample) => {
                                    let outcome = self.process_to(&sample, ctx, target, key);
                                    self.give_back(Ok(sample));
                                    outcome
                                }
                                Err(damaged) => self.skipped(damaged),
                            };
                            hub.done(outcome);
                        });
                    }
                    // Fed but not processed: the unit stopped.
                    feed.for_each(|input| self.give_back(input));
                    if tally.stopping {
                        hub.stop();
                    }
                }
            });
            hub.stop();
            reader
                .join()
                .map_or(None, |(read_error, _samples)| read_error)
        });
        if let Some(f) = tally.failure {
            return Err(f);
        }
        if let Some(e) = read_error {
            return Err(EngineError::Shard(e));
        }
        Ok(tally.stats)
    }

    /// A sample done with: its fields' buffers go back to its source's spares (by the last
    /// unit that holds it, when several read it together).
    fn give_back(&self, input: Input) {
        if let (Some(spares), Ok(sample)) = (&self.spares, input) {
            spares.give_back_shared(sample);
        }
    }
}

/// What the unit's thread makes of the outcomes it takes.
#[derive(Default)]
struct Tally {
    stats: UnitStats,
    /// The unit failed (a bad sample under the `fail` policy).
    failure: Option<EngineError>,
    /// The unit takes nothing more: the sink asked to stop, or it failed.
    stopping: bool,
}

impl Tally {
    /// Counts `outcome` and hands it to `sink`. Every outcome of a sample fed goes to the
    /// sink, also after it asked to stop (it accounts for each), until the unit fails; after
    /// that they are drained, so the pool's tasks finish.
    fn take(
        &mut self,
        outcome: Outcome,
        policy: BadSamplePolicy,
        sink: &mut impl FnMut(Outcome) -> bool,
    ) {
        if self.failure.is_some() {
            return;
        }
        match &outcome {
            Outcome::Done(_) => self.stats.done += 1,
            Outcome::Skipped(e) => {
                self.stats.skipped += 1;
                if policy == BadSamplePolicy::Fail {
                    self.failure = Some(EngineError::BadSample(e.clone()));
                    self.stopping = true;
                    return;
                }
            }
        }
        if !sink(outcome) {
            self.stopping = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::engine::{Engine, EngineConfig, Outcome, SampleContext};

    /// A JPEG sample of a test pattern (index `i`, labelled `i`).
    fn jpeg_sample(i: u64) -> sluice_shard::Sample {
        let img = image::RgbImage::from_fn(96, 64, |x, y| {
            image::Rgb([
                (x * 3 + y) as u8,
                (y * 5 + i as u32 * 17) as u8,
                (x ^ y) as u8,
            ])
        });
        let mut jpeg = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        sluice_shard::Sample {
            shard: "t.tar".into(),
            key: format!("s{i}"),
            index: i,
            start: 0,
            end: 0,
            fields: vec![
                sluice_shard::Field {
                    name: "jpg".into(),
                    data: jpeg,
                },
                sluice_shard::Field {
                    name: "cls".into(),
                    data: i.to_string().into_bytes(),
                },
            ],
            checksum: None,
        }
    }

    /// The unit's samples (a read it may share with other units of a sweep) are dropped when
    /// the unit ends, not when its reader has read them all: the read stays joinable while
    /// the unit runs.
    #[test]
    fn a_units_samples_are_dropped_with_the_unit_not_when_its_reader_ends() {
        struct Samples(std::vec::IntoIter<sluice_shard::Sample>, Arc<AtomicBool>);
        impl Iterator for Samples {
            type Item = Result<sluice_shard::Sample, sluice_shard::ShardError>;
            fn next(&mut self) -> Option<Self::Item> {
                self.0.next().map(Ok)
            }
        }
        impl Drop for Samples {
            fn drop(&mut self) {
                self.1.store(true, Ordering::SeqCst);
            }
        }
        let spec: sluice_wire::spec::PipelineSpec = "decode | resize 32x32".parse().unwrap();
        let engine = Engine::with_pool(spec, EngineConfig::default(), Engine::pool(1).unwrap());
        let dropped = Arc::new(AtomicBool::new(false));
        let samples = Samples((0..4).map(jpeg_sample).collect::<Vec<_>>().into_iter(), {
            dropped.clone()
        });
        let ctx = SampleContext {
            seed: 1,
            epoch: 0,
            shard: 0,
        };
        let mut seen = Vec::new();
        engine
            .run_unit(samples, ctx, |_| {
                // Each decode takes a while; the reader read all four at the start.
                std::thread::sleep(Duration::from_millis(20));
                seen.push(dropped.load(Ordering::SeqCst));
                true
            })
            .unwrap();
        assert_eq!(seen, [false; 4], "dropped while the unit ran");
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn a_tensor_in_the_window_is_copied_out_on_the_units_thread_as_a_decode_would_make_it() {
        let spec: sluice_wire::spec::PipelineSpec = "decode | random_resized_crop 32 | hflip 0.5"
            .parse()
            .unwrap();
        let pool = Engine::pool(1).unwrap();
        let window = crate::share::Window::new(1 << 20);
        let job = || {
            Engine::with_pool(spec.clone(), EngineConfig::default(), pool.clone()).with_sharing(
                crate::share::Sharing::join(&window, "", &format!("{spec:?}"), [7, 0, 0, 1]),
            )
        };
        let (first, second) = (job(), job());
        let alone = Engine::with_pool(spec.clone(), EngineConfig::default(), pool.clone());
        let samples: Vec<_> = (0..6).map(jpeg_sample).collect();
        let ctx = SampleContext {
            seed: 7,
            epoch: 0,
            shard: 0,
        };
        let run = |engine: &Engine| {
            let mut out = Vec::new();
            engine
                .run_unit(samples.clone().into_iter().map(Ok), ctx, |o| {
                    out.push(o);
                    true
                })
                .unwrap();
            out.sort_by_key(|o| match o {
                Outcome::Done(p) => p.index,
                Outcome::Skipped(e) => e.index,
            });
            out
        };
        let reference = run(&alone);
        let decoded = run(&first);
        // The pool's one thread is held: the second job's samples, all in the window, must
        // be copied out without it.
        let (hold, held) = std::sync::mpsc::sync_channel::<()>(1);
        pool.spawn(move || {
            let _ = held.recv();
        });
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        std::thread::scope(|scope| {
            scope.spawn(|| done.send(run(&second)).unwrap());
            let served = finished.recv_timeout(Duration::from_secs(20));
            hold.send(()).unwrap();
            let served = served.expect("the window's tensors were served without the pool");
            for ((r, d), s) in reference.iter().zip(&decoded).zip(&served) {
                let (Outcome::Done(r), Outcome::Done(d), Outcome::Done(s)) = (r, d, s) else {
                    panic!("a sample was skipped");
                };
                assert_eq!(
                    (&d.tensor, d.geometry, d.label),
                    (&r.tensor, r.geometry, r.label)
                );
                assert_eq!(
                    (&s.tensor, s.geometry, s.label),
                    (&r.tensor, r.geometry, r.label)
                );
                assert!(!d.shared && s.shared, "sample {}", s.index);
            }
            assert_eq!(served.len(), samples.len());
        });
    }
}
