//! One epoch's batches as the consumer reads them: an iterator over the coordinator's queue
//! that records what it hands out (for checkpoints), counts it, and turns the ways an epoch
//! can go wrong (a full ring, every sample skipped) into errors that say so.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_plan::Segment;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{Batch, SampleId};
use crate::error::ClientError;
use crate::ledger::Ledger;
use crate::stats::{EpochCounters, EpochReport, Stats};

/// before the epoch fails with [`ClientError::RingExhausted`].
const RING_DEADLOCK_GRACE: Duration = Duration::from_secs(5);
/// The same, when the consumer provably holds every batch of the ring.
const RING_HELD_GRACE: Duration = Duration::from_millis(300);

/// What the consumer has been handed in the current epoch.
///
/// It records one `Epoch` (its `pass`): the one the consumer trains on. A pass of the same
/// epoch begun while that one is still being read (a peek, `next(iter(loader))` in the middle
/// of an epoch) is read on its own and recorded nowhere, so a checkpoint always means the
/// batches the training pass was handed. A pass of another epoch, a loaded checkpoint, or any
/// pass once the recorded one has ended (run out, been dropped, or handed out every batch)
/// becomes the recorded pass.
pub(super) struct Progress {
    pub epoch: u64,
    /// The earlier worlds of this epoch (elastic resumes), oldest first.
    pub resumed: Vec<Segment>,
    pub batches: u64,
    /// Samples of this segment each rank takes (its batch plan's).
    pub samples: u64,
    pub ledger: Ledger,
    /// The `Epoch` whose batches this records.
    pub pass: u64,
    /// That `Epoch` can still hand out batches.
    pub open: bool,
}

/// One epoch's batches, in the order they are completed. Dropping it cancels the epoch.
pub struct Epoch {
    runtime: tokio::runtime::Handle,
    pub(super) epoch: u64,
    planned: u64,
    batches: u64,
    /// The index of the first batch it yields (a resumed epoch starts past 0).
    first_batch: u64,
    /// The segments before the one being read (earlier worlds, a mixture's earlier rounds).
    resumed: Vec<Segment>,
    /// The batches of the segment being read (a mixture's round).
    round_batches: u64,
    /// Batches of the segments before the one being read (each rank's): added to a
    /// segment's batch indexes, so a batch's index is its step in the epoch.
    offset: u64,
    /// Starts a mixture's next round when this one has run out (`None`: no round after it).
    rounds: Option<Box<dyn Rounds>>,
    rx: mpsc::Receiver<Result<Batch, ClientError>>,
    pub(super) cancel: CancellationToken,
    pub(super) counters: Arc<EpochCounters>,
    progress: Arc<Mutex<Option<Progress>>>,
    /// Which of the loader's passes this is: its batches are checkpointed while it is the
    /// recorded one (see [`Progress`]).
    pub(super) pass: u64,
    stats: Arc<Stats>,
    done: bool,
    /// Waiting done by `next_timeout` calls that timed out, charged to the next batch.
    pending_wait: Duration,
    ring_batches: usize,
    /// Samples delivered and skipped so far, and the first skip's reason: an epoch that
    /// skipped every sample ends with an error, not quietly after empty batches.
    seen: (u64, u64, Option<String>),
    /// Skips of batches not handed out (every sample skipped), reported with the next one.
    carried: Vec<(SampleId, String)>,
    /// Every skip so far was a setting the data cannot satisfy (see [`a_setting`]).
    settings_only: bool,
    /// A mixture's first shard of each source (empty: a single dataset).
    source_bounds: Arc<[u32]>,
    /// Samples delivered from each source so far.
    per_source: Vec<u64>,
}

/// Starts a mixture's next round when the one being read runs out, under the plan the epoch
/// started with (the loader's runner starts it): the round as an epoch of its own, and
/// what the consumer will have been handed once it takes it.
pub(super) trait Rounds: Send + Sync {
    fn next_round(
        &self,
        epoch: u64,
        resumed: &[Segment],
        counters: Arc<EpochCounters>,
    ) -> Result<(Epoch, Option<Progress>), ClientError>;
}

/// What an epoch's iterator is made of (see `Loader::start`).
pub(super) struct Parts {
    pub runtime: tokio::runtime::Handle,
    pub epoch: u64,
    /// The segment's (a mixture's round's).
    pub batch_plan: sluice_plan::BatchPlan,
    /// The rest of the epoch from the segment's start (its rounds after it included).
    pub rest: sluice_plan::BatchPlan,
    pub resumed: Vec<Segment>,
    pub rounds: Option<Box<dyn Rounds>>,
    pub first_batch: u64,
    pub rx: mpsc::Receiver<Result<Batch, ClientError>>,
    pub cancel: CancellationToken,
    pub counters: Arc<EpochCounters>,
    pub progress: Arc<Mutex<Option<Progress>>>,
    pub stats: Arc<Stats>,
    pub ring_batches: usize,
    pub source_bounds: Arc<[u32]>,
}

impl Epoch {
    pub(super) fn new(p: Parts) -> Epoch {
        let done = p.first_batch * p.batch_plan.batch_size;
        let offset = p.resumed.iter().map(|s| s.batches).sum();
        Epoch {
            runtime: p.runtime,
            epoch: p.epoch,
            planned: p.rest.samples.saturating_sub(done),
            batches: p.rest.batches,
            first_batch: p.first_batch,
            resumed: p.resumed,
            round_batches: p.batch_plan.batches,
            offset,
            rounds: p.rounds,
            rx: p.rx,
            cancel: p.cancel,
            counters: p.counters,
            progress: p.progress,
            pass: 0,
            stats: p.stats,
            done: false,
            pending_wait: Duration::ZERO,
            ring_batches: p.ring_batches,
            seen: (0, 0, None),
            carried: Vec::new(),
            settings_only: true,
            per_source: vec![0; p.source_bounds.len().saturating_sub(1).max(1)],
            source_bounds: p.source_bounds,
        }
    }

    /// Samples delivered from each source of a mixture so far (one entry for a single
    /// dataset), padding copies not counted.
    pub fn per_source(&self) -> &[u64] {
        &self.per_source
    }

    /// What the epoch has delivered so far.
    pub fn report(&self) -> EpochReport {
        self.counters.report(self.epoch, self.planned)
    }

    /// Batches this epoch has in all (the same on every rank).
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Batches this epoch yields: all of them, or after a resume the rest.
    pub fn batches_left(&self) -> u64 {
        self.batches.saturating_sub(self.first_batch)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Skips of the epoch's last batches, which were not handed out because every sample of
    /// them was skipped (earlier ones ride with the next batch handed out): with the batches'
    /// own `skipped`, every skip of the epoch, once.
    pub fn unbatched_skips(&self) -> &[(SampleId, String)] {
        &self.carried
    }

    fn record(&self, batch: &Batch, waited: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let padded = batch.padding().iter().filter(|p| **p).count() as u64;
        let real = batch.len() as u64 - padded;
        self.counters.delivered.fetch_add(real, Relaxed);
        self.counters.padded.fetch_add(padded, Relaxed);
        self.counters
            .skipped
            .fetch_add(batch.skipped().len() as u64, Relaxed);
        self.counters.batches.fetch_add(1, Relaxed);
        self.counters
            .starved_ns
            .fetch_add(waited.as_nanos() as u64, Relaxed);
        self.stats.batch(batch.len() as u64, waited);
        if let Ok(mut p) = self.progress.lock() {
            if let Some(p) = p.as_mut().filter(|p| p.pass == self.pass) {
                p.batches += 1;
                for &(unit, shard, index) in &batch.accounted {
                    p.ledger.record(unit, shard, index);
                }
                p.open = p.batches < self.round_batches || self.rounds.is_some();
            }
        }
    }

    /// The round being read has run out: the mixture's next round takes its place (its
    /// plan, links and coordinator), and becomes what a checkpoint records.
    fn next_round(&mut self) -> Result<(), ClientError> {
        let Some(runner) = self.rounds.take() else {
            return Ok(());
        };
        let counters = self.counters.clone();
        let (mut fresh, mut handed) = runner.next_round(self.epoch, &self.resumed, counters)?;
        // `fresh` ends up with this round's queue and token, and cancels them when dropped.
        std::mem::swap(&mut self.rx, &mut fresh.rx);
        std::mem::swap(&mut self.cancel, &mut fresh.cancel);
        self.offset += self.round_batches;
        self.round_batches = fresh.round_batches;
        self.resumed = std::mem::take(&mut fresh.resumed);
        self.rounds = fresh.rounds.take();
        if let Ok(mut p) = self.progress.lock() {
            if p.as_ref().is_some_and(|p| p.pass == self.pass) {
                *p = handed.take().map(|mut progress| {
                    progress.pass = self.pass;
                    progress
                });
            }
        }
        Ok(())
    }

    /// This pass hands out nothing more: another may become the recorded one.
    fn close(&mut self) {
        self.done = true;
        if let Ok(mut p) = self.progress.lock() {
            if let Some(p) = p.as_mut().filter(|p| p.pass == self.pass) {
                p.open = false;
            }
        }
    }
}

impl Epoch {
    /// Like `next`, but gives up after `timeout` (`Err(())`), so a caller can check for
    /// interruptions (Ctrl-C in Python) while it waits. The wait counts as starvation.
    #[allow(clippy::result_unit_err)]
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<Batch, ClientError>>, ()> {
        if self.done {
            return Ok(None);
        }
        let started = Instant::now();
        let waiting = &self.counters.consumer_waiting;
        waiting.store(true, std::sync::atomic::Ordering::Relaxed);
        let item = self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, self.rx.recv()).await });
        waiting.store(false, std::sync::atomic::Ordering::Relaxed);
        let waited = started.elapsed();
        match item {
            Err(_) => {
                self.pending_wait += waited;
                // The consumer waits for a batch while the coordinator waits for the consumer
                // to free a buffer: nothing can move unless another thread drops a batch.
                let ring_full = self
                    .counters
                    .ring_full
                    .load(std::sync::atomic::Ordering::Relaxed);
                // When the consumer holds every batch of the ring, only another of its
                // threads could free one: a short grace for that, not the long one.
                let held_all = self
                    .counters
                    .held_all
                    .load(std::sync::atomic::Ordering::Relaxed);
                let grace = match held_all {
                    true => RING_HELD_GRACE,
                    false => RING_DEADLOCK_GRACE,
                };
                if ring_full && self.pending_wait >= grace {
                    self.close();
                    self.cancel.cancel();
                    return Ok(Some(Err(ClientError::RingExhausted {
                        ring_batches: self.ring_batches,
                    })));
                }
                Err(())
            }
            Ok(item) => match self.finish_next(item, waited) {
                Some(next) => Ok(next),
                // A batch of skips only: not handed out, so the caller waits on.
                None => Err(()),
            },
        }
    }

    /// What the consumer gets for `item`; `None` for a batch whose every sample was skipped,
    /// which is recorded (its place in the epoch is taken) but never handed to a training loop.
    fn finish_next(
        &mut self,
        item: Option<Result<Batch, ClientError>>,
        waited: Duration,
    ) -> Option<Option<Result<Batch, ClientError>>> {
        let waited = waited + std::mem::take(&mut self.pending_wait);
        Some(match item {
            Some(Ok(mut batch)) => {
                batch.index += self.offset;
                self.record(&batch, waited);
                let real = batch.padding().iter().filter(|p| !**p).count() as u64;
                self.seen.0 += real;
                self.seen.1 += batch.skipped().len() as u64;
                if self.seen.2.is_none() {
                    self.seen.2 = batch.skipped().first().map(|(_, why)| why.clone());
                }
                self.settings_only &= batch.skipped().iter().all(|(_, why)| a_setting(why));
                if !batch.is_empty() {
                    batch.sources = batch
                        .ids()
                        .iter()
                        .map(|id| super::source_of(&self.source_bounds, id.shard))
                        .collect();
                    for (s, pad) in batch.sources.iter().zip(batch.padding()) {
                        if let Some(n) = self.per_source.get_mut(*s as usize).filter(|_| !pad) {
                            *n += 1;
                        }
                    }
                    if !self.carried.is_empty() {
                        // Skips of batches not handed out are reported with this one.
                        let mut skipped = std::mem::take(&mut self.carried);
                        skipped.append(&mut batch.skipped);
                        batch.skipped = skipped;
                    }
                    return Some(Some(Ok(batch)));
                }
                let early = self.seen.0 == 0 && self.seen.1 >= FAIL_FAST_SKIPS.min(self.planned);
                if early && self.settings_only {
                    self.close();
                    self.cancel.cancel();
                    return Some(Some(Err(ClientError::FirstSamplesSkipped {
                        epoch: self.epoch,
                        skipped: self.seen.1,
                        reasons: distinct_reasons(batch.skipped()),
                    })));
                }
                // Skips for a setting before any sample (a clip pipeline on images): said
                // once, by the error that ends the epoch at FAIL_FAST_SKIPS.
                if self.seen.0 > 0 || !self.settings_only {
                    tracing::warn!(
                        epoch = self.epoch,
                        batch = batch.index(),
                        "every one of the batch's {} samples was skipped, so it is not handed \
                         out (its skips come with the next batch); the first: {}",
                        batch.skipped().len(),
                        batch.skipped().first().map_or("", |(_, why)| why.as_str())
                    );
                }
                self.carried.append(&mut batch.skipped);
                return None;
            }
            Some(Err(e)) => {
                self.close();
                Some(Err(e))
            }
            None if self.rounds.is_some() => match self.next_round() {
                // Its first batch is waited for as any other.
                Ok(()) => return None,
                Err(e) => {
                    self.close();
                    Some(Err(e))
                }
            },
            None => {
                self.close();
                match &self.seen {
                    (0, skipped, Some(first)) if *skipped > 0 => {
                        Some(Err(ClientError::AllSkipped {
                            epoch: self.epoch,
                            skipped: *skipped,
                            first: first.clone(),
                        }))
                    }
                    _ => None,
                }
            }
        })
    }
}

/// Skipped samples after which, with none delivered yet and every one skipped for a setting
/// (see [`a_setting`]), an epoch stops: a label or image field the data does not have
/// (`label="cls"` on data without `.cls`) fails at once, not after an epoch of empty
/// batches. Damaged data never stops an epoch early: a rewritten first shard is skipped.
const FAIL_FAST_SKIPS: u64 = 32;

/// Whether a skip's reason ("key: cause") is one of the loader's settings meeting data that
/// cannot satisfy it (the label, the image field), not damage in the data.
fn a_setting(why: &str) -> bool {
    let cause = why.split_once(": ").map_or(why, |(_, c)| c);
    cause.starts_with("label: ") || cause.starts_with("no image field")
}

/// Up to three distinct reasons among `skipped` (a reason is "key: cause"), each with the
/// first sample it was given for.
fn distinct_reasons(skipped: &[(SampleId, String)]) -> String {
    let cause = |why: &str| why.split_once(": ").map_or(why, |(_, c)| c).to_string();
    let mut reasons: Vec<&str> = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    for (_, why) in skipped {
        if reasons.len() == 3 {
            break;
        }
        if !causes.contains(&cause(why)) {
            causes.push(cause(why));
            reasons.push(why);
        }
    }
    reasons.join("; ")
}

/// `Iterator` for an epoch of `$item`s over its `next_timeout`: `next` blocks until the next
/// one, asking again every half second. Call it from a plain thread, not from async code.
macro_rules! blocking_iterator {
    ($epoch:ty, $item:ty) => {
        impl Iterator for $epoch {
            type Item = Result<$item, ClientError>;

            fn next(&mut self) -> Option<Self::Item> {
                loop {
                    if let Ok(item) = self.next_timeout(std::time::Duration::from_millis(500)) {
                        return item;
                    }
                }
            }
        }
    };
}
pub(crate) use blocking_iterator;

blocking_iterator!(Epoch, Batch);

impl Drop for Epoch {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.close();
    }
}
