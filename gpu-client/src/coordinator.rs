//! One epoch's coordinator: hands the plan's units to workers a few at a time, grants
//! credits, accepts each planned sample once (the ledger), puts it in its place in the
//! delivery order ([`Reorder`]), fills batches in the ring, and moves the unfinished part of
//! a lost or failed worker's units to the others.
//!
//! In plan order, units go out in the order the sequence needs them (their first position),
//! only while that position is within `lookahead` of the next one to fill, which bounds what
//! can arrive early. When the next position's sample has not come for `hedge_after`, the
//! rest of its unit is also given to another worker (first copy wins; the ledger drops the
//! other as duplicates), so one slow worker does not stall the sequence.
//!
//! It runs as one task; everything it owns is plain state, and its only waits are for an
//! event, a free batch buffer, room in the consumer's queue, the hedging deadline, or the
//! no-worker deadline.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::Manifest;
use sluice_wire::{Assign, SampleShape, ShardRef};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{BatchPlan, Filling, HostAllocator, Ring, SampleId, ShortBatch};
use crate::error::ClientError;
use crate::ledger::{Ledger, Verdict};
use crate::link::{Command, Event};
use crate::reorder::{Arrival, Placement, Reorder};
use crate::stats::{EpochCounters, Stats};
use crate::Batch;

/// A sample range of a unit, as given to one worker in one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Piece {
    /// When the delivery order needs it: its earliest position (plan order), or its place in
    /// the plan's unit list, 0 for a requeued piece (arrival order). Lower goes first.
    priority: u64,
    unit: u64,
    start: u64,
    end: u64,
    attempt: u32,
}

struct LinkState {
    name: String,
    commands: mpsc::Sender<Command>,
    /// The connection generation commands go to; `None` while the link is down.
    generation: Option<u64>,
    open: Vec<Piece>,
    /// Credits granted and not yet used by a sample.
    outstanding: u32,
    /// Samples taken since the last credit frame.
    owed: u32,
    last_error: Option<String>,
}

pub(crate) struct Settings {
    pub job: u64,
    pub epoch: u64,
    pub batch_plan: BatchPlan,
    pub first_batch: u64,
    pub short_batch: ShortBatch,
    pub credits_per_worker: u32,
    pub receive_window: u64,
    pub units_per_worker: usize,
    pub ring_batches: usize,
    pub worker_wait: Duration,
    pub max_unit_attempts: u32,
    /// Plan order: how far ahead of the next position a unit may start.
    pub lookahead: u64,
    /// Plan order: how long the next position may wait before its unit is hedged.
    pub hedge_after: Duration,
}

pub(crate) struct Coordinator {
    settings: Settings,
    manifest: Arc<Manifest>,
    ledger: Ledger,
    reorder: Reorder,
    queue: BinaryHeap<Reverse<Piece>>,
    attempts: Vec<u32>,
    /// Units already hedged (at most once an epoch: a second stall is a lost worker's, which
    /// silence detection handles).
    hedged: Vec<bool>,
    /// When the delivery order last moved (a sample or skip filled its place).
    progressed: Instant,
    failures: Vec<(u32, String)>,
    links: Vec<LinkState>,
    shape: Option<SampleShape>,
    ring: Option<Arc<Ring>>,
    allocator: Arc<dyn HostAllocator>,
    filling: Option<Filling>,
    next_batch: u64,
    credit_window: u32,
    down_since: Option<Instant>,
    counters: Arc<EpochCounters>,
    stats: Arc<Stats>,
}

impl Coordinator {
    pub(crate) fn new(
        settings: Settings,
        manifest: Arc<Manifest>,
        (ledger, reorder): (Ledger, Reorder),
        links: Vec<(String, mpsc::Sender<Command>)>,
        allocator: Arc<dyn HostAllocator>,
        counters: Arc<EpochCounters>,
        stats: Arc<Stats>,
    ) -> Self {
        let mut queue = BinaryHeap::new();
        let units = (0..)
            .map_while(|id| ledger.unit(id).map(|u| (id, *u)))
            .collect::<Vec<_>>();
        let mut attempts = vec![0u32; units.len()];
        for (id, u) in &units {
            for (start, end) in ledger.missing(*id, u.start, u.end) {
                let priority = priority(&reorder, *id, start, end).unwrap_or(*id);
                queue.push(Reverse(Piece {
                    priority,
                    unit: *id,
                    start,
                    end,
                    attempt: attempts[*id as usize],
                }));
                attempts[*id as usize] += 1;
            }
        }
        Coordinator {
            next_batch: settings.first_batch,
            hedged: vec![false; units.len()],
            progressed: Instant::now(),
            reorder,
            attempts,
            failures: vec![(0, String::new()); units.len()],
            settings,
            manifest,
            ledger,
            queue,
            links: links
                .into_iter()
                .map(|(name, commands)| LinkState {
                    name,
                    commands,
                    generation: None,
                    open: Vec::new(),
                    outstanding: 0,
                    owed: 0,
                    last_error: None,
                })
                .collect(),
            shape: None,
            ring: None,
            allocator,
            filling: None,
            credit_window: 0,
            down_since: Some(Instant::now()),
            counters,
            stats,
        }
    }

    /// Runs the epoch: batches (or the error that ends it) go to `out`, in order.
    pub(crate) async fn run(
        mut self,
        mut events: mpsc::Receiver<Event>,
        out: mpsc::Sender<Result<Batch, ClientError>>,
        cancel: CancellationToken,
    ) {
        let result = tokio::select! {
            r = self.drive(&mut events, &out) => r,
            _ = cancel.cancelled() => Ok(()),
        };
        if let Err(e) = result {
            tracing::error!(epoch = self.settings.epoch, "{e}");
            let _ = out.send(Err(e)).await;
        }
        // Dropping the command senders ends every link (closing its connection).
        self.links.clear();
    }

    async fn drive(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        loop {
            if self.next_batch >= self.settings.batch_plan.batches {
                return Ok(());
            }
            self.dispatch().await;
            let deadline = self
                .down_since
                .map(|t| tokio::time::Instant::from_std(t + self.settings.worker_wait));
            let hedge = self.hedge_deadline().map(tokio::time::Instant::from_std);
            let event = tokio::select! {
                e = events.recv() => e,
                _ = sleep_until(deadline) => {
                    return Err(ClientError::WorkersLost {
                        waited: self.settings.worker_wait,
                        detail: self.last_errors(),
                    });
                }
                _ = sleep_until(hedge) => {
                    self.hedge().await;
                    continue;
                }
            };
            let Some(event) = event else {
                return Err(ClientError::Runtime("every link ended".into()));
            };
            self.handle(event, out).await?;
        }
    }

    fn last_errors(&self) -> String {
        let errors: Vec<String> = self
            .links
            .iter()
            .map(|l| {
                format!(
                    "{}: {}",
                    l.name,
                    l.last_error.as_deref().unwrap_or("never connected")
                )
            })
            .collect();
        errors.join("; ")
    }

    fn alive(&self) -> usize {
        self.links.iter().filter(|l| l.generation.is_some()).count()
    }

    /// Gives queued pieces to live links with room, least loaded first; in plan order only
    /// pieces the sequence needs within the lookahead.
    async fn dispatch(&mut self) {
        let horizon = self
            .reorder
            .next_position()
            .map_or(u64::MAX, |n| n.saturating_add(self.settings.lookahead));
        while self
            .queue
            .peek()
            .is_some_and(|Reverse(p)| p.priority < horizon)
        {
            let Some(i) = (0..self.links.len())
                .filter(|&i| {
                    let l = &self.links[i];
                    l.generation.is_some() && l.open.len() < self.settings.units_per_worker
                })
                .min_by_key(|&i| self.links[i].open.len())
            else {
                return;
            };
            let Some(Reverse(piece)) = self.queue.pop() else {
                return;
            };
            self.send_piece(i, piece).await;
        }
    }

    /// Sends `piece` to link `i`.
    async fn send_piece(&mut self, i: usize, piece: Piece) {
        {
            let Some(unit) = self.ledger.unit(piece.unit).copied() else {
                return;
            };
            let shard = &self.manifest.shards[unit.shard as usize];
            let assign = Assign {
                job: self.settings.job,
                unit: piece.unit,
                attempt: piece.attempt,
                shard: ShardRef {
                    index: unit.shard,
                    urls: vec![shard.url.clone()],
                    size: shard.size,
                    samples: shard.samples,
                    checksum: shard.checksum.0,
                    gzip: shard.compression == sluice_shard::Compression::Gzip,
                },
                start: piece.start,
                end: piece.end,
            };
            let link = &mut self.links[i];
            let generation = link.generation.unwrap_or(0);
            link.open.push(piece);
            if link
                .commands
                .send(Command::Assign(generation, assign))
                .await
                .is_err()
            {
                // The link task ended; its loss event will requeue the piece.
                return;
            }
            self.stats.set_in_flight(i, link.open.len());
        }
    }

    /// When to hedge: plan order, something is awaited, and the order has not moved for
    /// `hedge_after`.
    fn hedge_deadline(&self) -> Option<Instant> {
        let (unit, _) = self.reorder.awaited()?;
        if self.hedged.get(unit as usize).copied().unwrap_or(true) {
            return None;
        }
        Some(self.progressed + self.settings.hedge_after)
    }

    /// Gives the rest of the awaited sample's unit to a second live worker too, if a worker
    /// holds it and another is up. First copy wins: the ledger drops the slower one's.
    async fn hedge(&mut self) {
        let Some((unit, index)) = self.reorder.awaited() else {
            return;
        };
        if let Some(h) = self.hedged.get_mut(unit as usize) {
            *h = true;
        }
        let unit = u64::from(unit);
        let Some((holder, piece)) = self.links.iter().enumerate().find_map(|(i, l)| {
            l.open
                .iter()
                .find(|p| p.unit == unit && (p.start..p.end).contains(&index))
                .map(|p| (i, *p))
        }) else {
            return; // still queued (no worker has it): dispatch will send it
        };
        let Some(other) = (0..self.links.len())
            .filter(|&i| i != holder && self.links[i].generation.is_some())
            .min_by_key(|&i| self.links[i].open.len())
        else {
            return;
        };
        self.counters.hedged.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sluice_client_hedged_units_total").increment(1);
        tracing::info!(
            unit,
            slow = %self.links[holder].name,
            to = %self.links[other].name,
            "sample {index} of unit {unit} is late: hedging the rest of the unit"
        );
        for (start, end) in self.ledger.missing(unit, piece.start, piece.end) {
            let a = &mut self.attempts[unit as usize];
            let attempt = *a;
            *a += 1;
            let piece = Piece {
                priority: 0,
                unit,
                start,
                end,
                attempt,
            };
            self.send_piece(other, piece).await;
        }
    }

    async fn handle(
        &mut self,
        event: Event,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        match event {
            Event::Ready {
                link,
                generation,
                shape,
            } => self.ready(link, generation, shape).await,
            Event::Sample {
                link,
                header,
                payload,
            } => {
                self.counters.received.fetch_add(1, Ordering::Relaxed);
                self.used_credit(link).await;
                match self.ledger.record(header.unit, header.shard, header.index) {
                    Verdict::Accept => {
                        self.stats.sample_from(link);
                        let id = SampleId {
                            shard: header.shard,
                            index: header.index,
                        };
                        let (unit, index) = (header.unit, header.index);
                        if self.reorder.take_turn(unit, index) {
                            // Its turn: straight from the payload into the ring.
                            self.filling(out).await?.push(
                                |slot| payload.copy_tensor(slot),
                                header.label,
                                id,
                                header.key,
                                unit,
                            );
                            self.progressed = Instant::now();
                            self.close_if_full(out).await?;
                            return self.release(out).await;
                        }
                        let tensor_bytes = self.shape.map_or(0, |s| s.bytes() as usize);
                        let arrival = Arrival::Sample {
                            label: header.label,
                            id,
                            key: header.key,
                            unit,
                            tensor: payload.into_tensor(tensor_bytes),
                        };
                        self.place(unit, index, arrival, out).await
                    }
                    Verdict::Duplicate => {
                        self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("sluice_client_duplicates_dropped_total").increment(1);
                        Ok(())
                    }
                    Verdict::Unplanned => {
                        self.counters.unplanned.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!("sluice_client_unplanned_dropped_total").increment(1);
                        Ok(())
                    }
                }
            }
            Event::Skipped { skipped, .. } => {
                match self
                    .ledger
                    .record(skipped.unit, skipped.shard, skipped.index)
                {
                    Verdict::Accept => {
                        tracing::warn!(shard = skipped.shard, key = %skipped.key,
                                       "sample skipped: {}", skipped.reason);
                        metrics::counter!("sluice_client_skipped_total").increment(1);
                        let id = SampleId {
                            shard: skipped.shard,
                            index: skipped.index,
                        };
                        let reason = format!("{}: {}", skipped.key, skipped.reason);
                        let arrival = Arrival::Skip {
                            id,
                            reason,
                            unit: skipped.unit,
                        };
                        self.place(skipped.unit, skipped.index, arrival, out).await
                    }
                    Verdict::Duplicate => {
                        self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    Verdict::Unplanned => Ok(()),
                }
            }
            Event::UnitDone { link, done } => self.piece_ended(link, done.unit, done.attempt, None),
            Event::UnitFailed { link, failed } => {
                self.piece_ended(link, failed.unit, failed.attempt, Some(failed.error))
            }
            Event::Lost {
                link,
                generation,
                error,
                fatal,
            } => {
                if let Some(f) = fatal {
                    return Err(f);
                }
                self.lost(link, generation, error);
                Ok(())
            }
        }
    }

    async fn ready(
        &mut self,
        link: usize,
        generation: u64,
        shape: SampleShape,
    ) -> Result<(), ClientError> {
        match self.shape {
            None => {
                let bytes = shape.bytes();
                if bytes == 0 {
                    return Err(ClientError::Protocol {
                        worker: self.links[link].name.clone(),
                        detail: "announced an empty sample shape".into(),
                    });
                }
                let batch_bytes = bytes as usize * self.settings.batch_plan.batch_size as usize;
                let ring = Ring::new(&*self.allocator, self.settings.ring_batches, batch_bytes)
                    .map_err(ClientError::Allocate)?;
                self.ring = Some(ring);
                self.shape = Some(shape);
                self.credit_window = credit_window(
                    self.settings.credits_per_worker,
                    self.settings.receive_window,
                    bytes,
                );
            }
            Some(s) if s != shape => {
                return Err(ClientError::Shape {
                    workers: self.links.iter().map(|l| l.name.clone()).collect(),
                    detail: format!("{s:?} and {shape:?} (from {})", self.links[link].name),
                });
            }
            Some(_) => {}
        }
        let window = self.credit_window;
        let l = &mut self.links[link];
        l.generation = Some(generation);
        l.outstanding = window;
        l.owed = 0;
        self.down_since = None;
        self.stats.set_alive(link, true);
        tracing::debug!(worker = %l.name, generation, "worker ready");
        let _ = l.commands.send(Command::Credit(generation, window)).await;
        Ok(())
    }

    /// A sample consumed one credit of `link`; give credits back in small batches.
    async fn used_credit(&mut self, link: usize) {
        let window = self.credit_window;
        let l = &mut self.links[link];
        l.outstanding = l.outstanding.saturating_sub(1);
        l.owed += 1;
        if let Some(g) = l.generation {
            if l.owed >= (window / 4).max(1) {
                let n = std::mem::take(&mut l.owed);
                l.outstanding += n;
                let _ = l.commands.send(Command::Credit(g, n)).await;
            }
        }
    }

    /// The batch being filled, waiting for a free ring buffer if there is none.
    async fn filling(
        &mut self,
        _out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<&mut Filling, ClientError> {
        if self.filling.is_none() {
            let ring = self.ring.clone().ok_or_else(|| {
                ClientError::Runtime("a sample before any worker was ready".into())
            })?;
            let started = Instant::now();
            self.counters.ring_full.store(true, Ordering::Relaxed);
            let buf = ring.acquire().await;
            self.counters.ring_full.store(false, Ordering::Relaxed);
            self.stats.ring_wait(started.elapsed());
            let shape = self.shape.unwrap_or(SampleShape {
                height: 0,
                width: 0,
                channels: 0,
                elem_bytes: 0,
                chw: false,
            });
            let target = self.settings.batch_plan.target(self.next_batch);
            self.filling = Some(Filling::new(
                buf,
                ring,
                shape,
                self.settings.epoch,
                self.next_batch,
                target,
            ));
        }
        self.filling
            .as_mut()
            .ok_or_else(|| ClientError::Runtime("no batch".into()))
    }

    /// Puts an accepted arrival in its place: the batch being filled if its turn has come,
    /// else the holding area; then lets out whatever has become due.
    async fn place(
        &mut self,
        unit: u64,
        index: u64,
        arrival: Arrival,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        if let Placement::Now(a) = self.reorder.offer(unit, index, arrival) {
            self.fill(a, out).await?;
        }
        self.release(out).await
    }

    /// Fills batches with held arrivals whose turn has come.
    async fn release(
        &mut self,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        loop {
            let draining = self.ledger.is_complete();
            let Some(a) = self.reorder.release(draining) else {
                break;
            };
            self.fill(a, out).await?;
        }
        let (held, peak) = self.reorder.held();
        self.counters
            .reorder_peak
            .fetch_max(peak as u64, Ordering::Relaxed);
        metrics::gauge!("sluice_client_reorder_held_samples").set(held as f64);
        Ok(())
    }

    async fn fill(
        &mut self,
        arrival: Arrival,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        match arrival {
            Arrival::Sample {
                label,
                id,
                key,
                unit,
                tensor,
            } => self.filling(out).await?.push(
                |slot| slot.copy_from_slice(&tensor[..slot.len()]),
                label,
                id,
                key,
                unit,
            ),
            Arrival::Skip { id, reason, unit } => self.filling(out).await?.skip(id, reason, unit),
        }
        self.progressed = Instant::now();
        self.close_if_full(out).await
    }

    async fn close_if_full(
        &mut self,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        if !self.filling.as_ref().is_some_and(Filling::is_full) {
            return Ok(());
        }
        let Some(f) = self.filling.take() else {
            return Ok(());
        };
        let batch = f.finish(self.settings.short_batch);
        self.next_batch += 1;
        if out.send(Ok(batch)).await.is_err() {
            return Err(ClientError::Runtime("the consumer went away".into()));
        }
        Ok(())
    }

    fn piece_ended(
        &mut self,
        link: usize,
        unit: u64,
        attempt: u32,
        error: Option<String>,
    ) -> Result<(), ClientError> {
        let l = &mut self.links[link];
        let Some(pos) = l
            .open
            .iter()
            .position(|p| p.unit == unit && p.attempt == attempt)
        else {
            return Ok(()); // an attempt already moved elsewhere
        };
        let piece = l.open.swap_remove(pos);
        self.stats.set_in_flight(link, l.open.len());
        if let Some(e) = &error {
            tracing::warn!(worker = %l.name, unit, "unit failed: {e}");
            let f = &mut self.failures[unit as usize];
            f.0 += 1;
            f.1 = e.clone();
            if f.0 >= self.settings.max_unit_attempts {
                let u = self.ledger.unit(unit).copied();
                return Err(ClientError::UnitFailed {
                    unit,
                    shard: u
                        .map(|u| self.manifest.shards[u.shard as usize].url.clone())
                        .unwrap_or_default(),
                    start: piece.start,
                    end: piece.end,
                    attempts: f.0,
                    error: e.clone(),
                });
            }
        }
        self.requeue(piece);
        Ok(())
    }

    /// Puts the part of `piece` not yet accounted for back in the queue, ahead of fresh units
    /// (arrival order) or where the sequence needs it (plan order).
    fn requeue(&mut self, piece: Piece) {
        let missing = self.ledger.missing(piece.unit, piece.start, piece.end);
        if missing.is_empty() {
            return;
        }
        self.counters.reassigned.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sluice_client_reassigned_units_total").increment(1);
        // Every piece of a unit gets its own attempt number, so a worker's report names
        // exactly one piece.
        for &(start, end) in &missing {
            let a = &mut self.attempts[piece.unit as usize];
            let attempt = *a;
            *a += 1;
            let priority = priority(&self.reorder, piece.unit, start, end).unwrap_or(0);
            self.queue.push(Reverse(Piece {
                priority,
                unit: piece.unit,
                start,
                end,
                attempt,
            }));
        }
    }

    fn lost(&mut self, link: usize, generation: u64, error: String) {
        let l = &mut self.links[link];
        l.last_error = Some(error);
        if l.generation.is_some_and(|g| g != generation) {
            return; // an older connection's late news
        }
        l.generation = None;
        l.outstanding = 0;
        l.owed = 0;
        let open = std::mem::take(&mut l.open);
        self.stats.set_alive(link, false);
        self.stats.set_in_flight(link, 0);
        for piece in open {
            self.requeue(piece);
        }
        if self.alive() == 0 && self.down_since.is_none() {
            self.down_since = Some(Instant::now());
        }
    }
}

/// When the delivery order needs samples `start..end` of `unit`: their earliest position in
/// plan order, `None` in arrival order.
fn priority(reorder: &Reorder, unit: u64, start: u64, end: u64) -> Option<u64> {
    match reorder {
        Reorder::Plan { sequence, .. } => {
            sequence.first_position_in(u32::try_from(unit).ok()?, start, end)
        }
        Reorder::Arrival { .. } => None,
    }
}

/// Credits per worker connection: never more than the connection's receive window holds.
/// A same-host link makes exactly this many slots, so a credit always has a slot behind it.
pub(crate) fn credit_window(credits: u32, receive_window: u64, sample_bytes: u64) -> u32 {
    let fit = (receive_window / sample_bytes.max(1)).max(1);
    u64::from(credits).min(fit) as u32
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod simulation;

#[cfg(test)]
mod tests {
    use sluice_shard::{Checksum, Compression, ShardInfo};
    use sluice_wire::{SampleHeader, UnitDone};

    use super::*;
    use crate::batch::{HeapAllocator, LastBatch};
    use crate::ledger::Ledger;

    const SHAPE: SampleShape = SampleShape {
        height: 1,
        width: 1,
        channels: 3,
        elem_bytes: 1,
        chw: false,
    };

    fn sample(link: usize, unit: u64, attempt: u32, index: u64) -> Event {
        Event::Sample {
            link,
            header: SampleHeader {
                job: 9,
                unit,
                attempt,
                shard: 0,
                index,
                key: format!("{index}"),
                label: Some(index as i64),
                tensor_bytes: 3,
                fields: Vec::new(),
            },
            payload: crate::same_host::Payload::Bytes(vec![index as u8; 3]),
        }
    }

    /// Two links; link 0 is lost after some samples, a late frame of its attempt arrives
    /// after the reassignment, and the reassigned piece repeats what was already delivered.
    #[tokio::test]
    async fn reassignment_delivers_each_sample_once_and_counts_duplicates() {
        let manifest = Arc::new(Manifest::new(vec![ShardInfo {
            url: "file:///s.tar".into(),
            size: 1,
            samples: 8,
            checksum: Checksum(0),
            compression: Compression::None,
        }]));
        let units = vec![sluice_plan::WorkUnit {
            id: 0,
            shard: 0,
            start: 0,
            end: 8,
            padding: false,
        }];
        let sequence = Arc::new(
            sluice_plan::Sequence::new(&units, sluice_plan::Mixing::default(), 1, 0, 0).unwrap(),
        );
        let (tx0, mut rx0) = mpsc::channel(16);
        let (tx1, mut rx1) = mpsc::channel(16);
        let counters = Arc::new(EpochCounters::default());
        let c = Coordinator::new(
            Settings {
                job: 9,
                epoch: 0,
                batch_plan: BatchPlan::new(8, 4, LastBatch::Partial),
                first_batch: 0,
                short_batch: ShortBatch::Deliver,
                credits_per_worker: 4,
                receive_window: 1 << 20,
                units_per_worker: 1,
                ring_batches: 2,
                worker_wait: Duration::from_secs(5),
                max_unit_attempts: 3,
                lookahead: 8,
                hedge_after: Duration::from_secs(60),
            },
            manifest,
            (Ledger::new(&units), Reorder::plan(sequence.clone(), 0)),
            vec![("w0".into(), tx0), ("w1".into(), tx1)],
            Arc::new(HeapAllocator),
            counters.clone(),
            Arc::new(Stats::new()),
        );
        let (ev_tx, ev_rx) = mpsc::channel(64);
        let (out_tx, mut out_rx) = mpsc::channel(4);
        let task = tokio::spawn(c.run(ev_rx, out_tx, CancellationToken::new()));
        ev_tx
            .send(Event::Ready {
                link: 0,
                generation: 1,
                shape: SHAPE,
            })
            .await
            .unwrap();
        // Link 0 gets its credits and the only piece.
        assert!(matches!(rx0.recv().await, Some(Command::Credit(1, 4))));
        let Some(Command::Assign(1, a)) = rx0.recv().await else {
            panic!("no assignment")
        };
        assert_eq!((a.start, a.end, a.attempt), (0, 8, 0));
        for i in 0..3 {
            ev_tx.send(sample(0, 0, 0, i)).await.unwrap();
        }
        ev_tx
            .send(Event::Lost {
                link: 0,
                generation: 1,
                error: "gone".into(),
                fatal: None,
            })
            .await
            .unwrap();
        // A frame link 0 sent before it died, read after the loss: still new, so kept.
        ev_tx.send(sample(0, 0, 0, 3)).await.unwrap();
        ev_tx
            .send(Event::Ready {
                link: 1,
                generation: 1,
                shape: SHAPE,
            })
            .await
            .unwrap();
        assert!(matches!(rx1.recv().await, Some(Command::Credit(1, 4))));
        let Some(Command::Assign(1, b)) = rx1.recv().await else {
            panic!("no reassignment")
        };
        assert_eq!((b.start, b.end), (3, 8), "only what was not yet delivered");
        assert!(b.attempt > 0);
        // Link 1 repeats sample 3 (delivered meanwhile), then sends the rest.
        for i in 3..8 {
            ev_tx.send(sample(1, 0, b.attempt, i)).await.unwrap();
        }
        ev_tx
            .send(Event::UnitDone {
                link: 1,
                done: UnitDone {
                    job: 9,
                    unit: 0,
                    attempt: b.attempt,
                    sent: 5,
                    skipped: 0,
                },
            })
            .await
            .unwrap();
        let mut ids = Vec::new();
        while let Some(batch) = out_rx.recv().await {
            let batch = batch.unwrap();
            assert_eq!(batch.labels().len(), batch.len());
            ids.extend(batch.ids().iter().map(|id| id.index));
        }
        task.await.unwrap();
        let planned: Vec<u64> = (0..8).map(|p| sequence.at(p).unwrap().1).collect();
        assert_eq!(ids, planned, "batches in the plan's order");
        ids.sort();
        assert_eq!(ids, (0..8).collect::<Vec<_>>());
        let r = counters.report(0, 8);
        assert_eq!((r.duplicates_dropped, r.reassigned), (1, 1));
    }
}
