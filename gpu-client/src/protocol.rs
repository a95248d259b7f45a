//! The client's half of the worker–client protocol as a state machine with no IO: feed it
//! what links report and the time, ask it for actions (in the style of `quinn-proto`).
//!
//! It owns the plan cursor (the queue of unit pieces, ordered by when the delivery order
//! needs them), the ledger, every link's credits and open pieces, the reorder area,
//! reassignment after a loss or failure, and hedging. It never waits: the coordinator
//! (`crate::coordinator`) is the async shell that sends its commands to links, fills ring
//! buffers with what it lets out, and sleeps until [`Protocol::poll_timeout`].
//!
//! Actions come out in the order they must be carried out: a `Fill` always belongs to the
//! batch being filled, and `Close` follows the fill that completed a batch.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::Manifest;
use sluice_wire::{Assign, SampleFields, SampleHeader, SampleShape, ShardRef, SkippedSample};

use crate::affinity::{LinkView, Owner, Owners};
use crate::batch::{SampleId, SampleMeta};
use crate::config::EpochSettings;
use crate::error::ClientError;
use crate::ledger::{Ledger, Verdict};
use crate::reorder::{Arrival, Placement, Reorder};
use crate::session::credit_window;
use crate::stats::{EpochCounters, Stats};

/// Skips logged by name in an epoch before the log only counts them.
const SKIPS_NAMED: u64 = 10;
/// After those, one skip in this many is logged.
const SKIPS_SUMMARY_EVERY: u64 = 1000;

/// A sample's tensor as the protocol passes it around: the shell's payload type.
pub(crate) trait Tensor {
    /// The tensor alone, for a sample that must wait for its turn (a same-host slot only
    /// if the segment can spare it: a held sample may not keep a credit's slot).
    fn detach(self, tensor_bytes: usize) -> Self;

    /// Whether the sample spent a credit: one written straight into its place in the batch
    /// arena did not (the place bounds it, and the worker kept the credit).
    fn spent_credit(&self) -> bool {
        true
    }
}

/// What the shell must do.
#[derive(Debug)]
pub(crate) enum Action<P> {
    /// Give a unit piece to a link's connection `generation`.
    Assign(usize, u64, Assign),
    /// Grant credits to a link's connection `generation`.
    Credit(usize, u64, u32),
    /// The first worker announced the sample shape: make the ring for it.
    Ring(SampleShape),
    /// Put this sample (or skip) into the batch being filled.
    Fill(Arrival<P>),
    /// The batch being filled is complete: finish it and hand it to the consumer.
    Close,
    /// The link's worker left the pool: tell its link (a dead worker is declared lost
    /// sooner).
    Drain(usize),
    /// The link's worker left the pool and has nothing open: close the link.
    Release(usize),
}

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
    /// The connection generation commands go to; `None` while the link is down.
    generation: Option<u64>,
    open: Vec<Piece>,
    /// Credits granted and not yet used by a sample.
    outstanding: u32,
    /// Samples taken since the last credit grant.
    owed: u32,
    last_error: Option<String>,
    /// It refused the handshake: left out for the rest of the epoch.
    excluded: bool,
    /// Its worker left the pool: it gets no new piece, and is released once it has none.
    leaving: bool,
    /// Released (see [`Action::Release`]): it is gone for the rest of the epoch.
    released: bool,
}

impl LinkState {
    fn new(name: String) -> Self {
        LinkState {
            name,
            generation: None,
            open: Vec::new(),
            outstanding: 0,
            owed: 0,
            last_error: None,
            excluded: false,
            leaving: false,
            released: false,
        }
    }
}

/// Queued pieces a free link looks through for one its worker owns.
const AFFINITY_SCAN: usize = 64;

/// How long the piece the consumer waits for waits for its owner (whose slots are full, or
/// who is still connecting) before another worker takes it: about one unit's decode, so a
/// cache hit is worth it, and far below `hedge_after`.
const AFFINITY_WAIT: Duration = Duration::from_millis(200);

/// One rank's epoch, as the protocol tracks it.
pub(crate) struct Protocol<P> {
    settings: EpochSettings,
    manifest: Arc<Manifest>,
    ledger: Ledger,
    reorder: Reorder<P>,
    queue: BinaryHeap<Reverse<Piece>>,
    attempts: Vec<u32>,
    /// Units already hedged (at most once an epoch: a second stall is a lost worker's, which
    /// silence detection handles).
    hedged: Vec<bool>,
    /// When the delivery order last moved (a sample or skip filled its place).
    progressed: Instant,
    failures: Vec<(u32, String)>,
    links: Vec<LinkState>,
    /// Which worker each unit's shard belongs to (see [`crate::affinity`]).
    owners: Owners,
    /// Each unit's shard, to work the owners out again when the pool changes.
    unit_shards: Vec<u32>,
    shape: Option<SampleShape>,
    credit_window: u32,
    down_since: Option<Instant>,
    /// The batch being filled, and how many of its places are filled.
    next_batch: u64,
    in_batch: usize,
    actions: VecDeque<Action<P>>,
    counters: Arc<EpochCounters>,
    stats: Arc<Stats>,
    /// Skips logged so far this epoch (see [`SKIPS_NAMED`]).
    skips_logged: u64,
    /// Skips not logged yet because no sample of the epoch has arrived: a pipeline that fits
    /// no sample (a clip pipeline on images, a wrong `field=`) ends the epoch with one error
    /// naming the first, not a page of warnings first. Logged at the first sample.
    skips_held: Vec<(u32, String, String)>,
    /// A sample of this epoch has arrived.
    delivered_any: bool,
    /// No unit is handed out yet (an epoch started early, behind one still handing out its
    /// own).
    held: bool,
    /// The latest time any event brought (dispatch has none of its own).
    clock: Instant,
    /// A worker announced a shard cache: each shard's units go to the worker that owns it.
    affinity: bool,
}

impl<P: Tensor> Protocol<P> {
    pub(crate) fn new(
        settings: EpochSettings,
        manifest: Arc<Manifest>,
        (ledger, reorder): (Ledger, Reorder<P>),
        links: Vec<String>,
        (counters, stats): (Arc<EpochCounters>, Arc<Stats>),
        now: Instant,
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
        let shards: Vec<u32> = units.iter().map(|(_, u)| u.shard).collect();
        let owners = Owners::new(links.iter().map(|l| Some(l.as_str())), &manifest, &shards);
        Protocol {
            owners,
            unit_shards: shards,
            next_batch: settings.first_batch,
            in_batch: 0,
            hedged: vec![false; units.len()],
            progressed: now,
            clock: now,
            affinity: false,
            reorder,
            attempts,
            failures: vec![(0, String::new()); units.len()],
            settings,
            manifest,
            ledger,
            queue,
            links: links.into_iter().map(LinkState::new).collect(),
            shape: None,
            credit_window: 0,
            down_since: Some(now),
            actions: VecDeque::new(),
            counters,
            stats,
            skips_logged: 0,
            skips_held: Vec::new(),
            delivered_any: false,
            held: false,
        }
    }

    /// Hands out no unit until [`Protocol::unhold`]: links connect, announce their shape and
    /// get credits, and wait.
    pub(crate) fn hold(&mut self) {
        self.held = true;
    }

    /// Units may go out from `now`; the hedging clock starts then.
    pub(crate) fn unhold(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        self.held = false;
        self.waited(now);
    }

    /// A worker joined the pool: a new link `name`, returned as its number (the next one).
    pub(crate) fn join(&mut self, name: String) -> usize {
        self.links.push(LinkState::new(name));
        self.reown();
        self.links.len() - 1
    }

    /// Link `link`'s worker left the pool: it gets no new piece; what it has open finishes
    /// there (or comes back to the queue if it is lost), and then it is released.
    pub(crate) fn leave(&mut self, link: usize, now: Instant) {
        self.clock = self.clock.max(now);
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        if l.leaving {
            return;
        }
        l.leaving = true;
        tracing::debug!(worker = %l.name, open = l.open.len(), "draining a worker that left the pool");
        self.reown();
        self.actions.push_back(Action::Drain(link));
        self.release_if_drained(link, now);
    }

    /// Releases `link` if it is leaving and has nothing open.
    fn release_if_drained(&mut self, link: usize, now: Instant) {
        let l = &mut self.links[link];
        if !l.leaving || l.released || !l.open.is_empty() {
            return;
        }
        l.released = true;
        l.generation = None;
        l.outstanding = 0;
        self.stats.set_alive(link, false);
        self.stats.set_in_flight(link, 0);
        self.actions.push_back(Action::Release(link));
        if self.alive() == 0 && self.down_since.is_none() {
            self.down_since = Some(now);
        }
    }

    /// Works out the units' owners again over the links still in the pool.
    fn reown(&mut self) {
        let names = self
            .links
            .iter()
            .map(|l| (!l.leaving).then_some(l.name.as_str()));
        self.owners = Owners::new(names, &self.manifest, &self.unit_shards);
    }

    /// Every batch of the epoch has been closed.
    pub(crate) fn finished(&self) -> bool {
        self.next_batch >= self.settings.batch_plan.batches
    }

    /// Every piece of the plan has been handed to a worker (a lost or failed one may still
    /// come back to the queue).
    pub(crate) fn all_dispatched(&self) -> bool {
        self.queue.is_empty()
    }

    /// The delivery order could not move until `now` (the shell waited for a free ring
    /// buffer, or the epoch was held): that time does not count towards hedging.
    pub(crate) fn waited(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        self.progressed = self.progressed.max(now);
    }

    /// The next action to carry out, after handing out whatever work fits.
    pub(crate) fn poll_action(&mut self) -> Option<Action<P>> {
        if self.actions.is_empty() {
            self.dispatch();
        }
        self.actions.pop_front()
    }

    /// When [`Protocol::timeout`] must be called (the hedging, the no-worker or the
    /// affinity deadline).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let wait = self
            .down_since
            .map(|t| t + self.settings.config.worker_wait);
        [wait, self.hedge_deadline(), self.affinity_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the piece the consumer waits for may go to a worker that does not own it, if it
    /// is still queued then (see [`Self::dispatch`]).
    fn affinity_deadline(&self) -> Option<Instant> {
        if self.held || !self.affinity {
            return None;
        }
        let next = self.reorder.next_position()?;
        // A queued piece's priority is its earliest undelivered position, never below `next`:
        // the awaited piece, when queued, is the queue's least.
        let queued = self
            .queue
            .peek()
            .is_some_and(|Reverse(p)| p.priority <= next);
        let at = self.progressed + AFFINITY_WAIT;
        (queued && at > self.clock).then_some(at)
    }

    /// Time has reached a deadline: hedge a late unit, or fail with no worker left.
    pub(crate) fn timeout(&mut self, now: Instant) -> Result<(), ClientError> {
        self.clock = self.clock.max(now);
        if let Some(t) = self.down_since {
            if now >= t + self.settings.config.worker_wait {
                return Err(ClientError::WorkersLost {
                    waited: self.settings.config.worker_wait,
                    detail: self.last_errors(),
                });
            }
        }
        if self.hedge_deadline().is_some_and(|d| now >= d) {
            self.hedge();
        }
        Ok(())
    }

    /// A link's connection `generation` is up and announced its sample shape.
    pub(crate) fn ready(
        &mut self,
        link: usize,
        generation: u64,
        shape: SampleShape,
        caches: bool,
    ) -> Result<(), ClientError> {
        if self.links.get(link).is_none_or(|l| l.leaving) {
            return Ok(()); // its worker left the pool: it is being closed
        }
        // Shard affinity pays only where a worker keeps a cache.
        self.affinity |= caches;
        match self.shape {
            None => {
                let bytes = shape.bytes();
                if bytes == 0 {
                    return Err(ClientError::Protocol {
                        worker: self.links[link].name.clone(),
                        detail: "announced an empty sample shape".into(),
                    });
                }
                self.shape = Some(shape);
                self.credit_window = credit_window(
                    self.settings.config.credits_per_worker,
                    self.settings.config.receive_window,
                    bytes,
                );
                self.actions.push_back(Action::Ring(shape));
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
        self.actions
            .push_back(Action::Credit(link, generation, window));
        Ok(())
    }

    /// The skips held back until a sample arrived, logged now that one has.
    fn log_held_skips(&mut self) {
        self.delivered_any = true;
        for (n, (shard, key, reason)) in
            std::mem::take(&mut self.skips_held).into_iter().enumerate()
        {
            warn_skip(n as u64, shard, &key, &reason);
        }
        if self.skips_logged > SKIPS_NAMED {
            tracing::warn!(
                "{} more samples skipped before the first arrived; from here every \
                 {SKIPS_SUMMARY_EVERY}th is logged (each batch lists its own)",
                self.skips_logged - SKIPS_NAMED
            );
        }
    }

    /// A sample frame from `link`.
    pub(crate) fn sample(
        &mut self,
        link: usize,
        header: SampleHeader,
        payload: P,
        fields: SampleFields,
        now: Instant,
    ) {
        self.clock = self.clock.max(now);
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        if payload.spent_credit() {
            self.used_credit(link);
        }
        if let Some(reason) = header
            .label
            .and_then(|l| self.settings.config.labels.check(l))
        {
            let skipped = SkippedSample {
                job: header.job,
                unit: header.unit,
                attempt: header.attempt,
                shard: header.shard,
                index: header.index,
                key: header.key,
                reason,
            };
            return self.skipped(skipped, now);
        }
        match self.ledger.record(header.unit, header.shard, header.index) {
            Verdict::Accept => {
                if !self.delivered_any {
                    self.log_held_skips();
                }
                self.stats.sample_from(link);
                let (unit, index) = (header.unit, header.index);
                let due = self.reorder.take_turn(unit, index);
                let tensor = if due {
                    payload // its turn: straight from the payload into the ring
                } else {
                    payload.detach(self.shape.map_or(0, |s| s.bytes() as usize))
                };
                let arrival = Arrival::Sample {
                    id: SampleId {
                        shard: header.shard,
                        index,
                    },
                    unit,
                    tensor,
                    meta: SampleMeta {
                        padding: self.ledger.unit(unit).is_some_and(|u| u.padding),
                        label: header.label,
                        key: header.key,
                        fields,
                        geometry: header.geometry,
                    },
                };
                if due {
                    self.fill(arrival, now);
                    self.release(now);
                } else {
                    self.place(unit, index, arrival, now);
                }
            }
            Verdict::Duplicate => {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("sluice_client_duplicates_dropped_total").increment(1);
            }
            Verdict::Unplanned => {
                self.counters.unplanned.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("sluice_client_unplanned_dropped_total").increment(1);
            }
        }
    }

    /// Batches after the one being filled that samples have arrived for so far: how far
    /// ahead binding batches to buffers pays.
    pub(crate) fn batches_reached(&self) -> u64 {
        self.reorder
            .reach()
            .div_ceil(self.settings.batch_plan.batch_size.max(1))
    }

    /// A sample the worker's decoder rejected.
    pub(crate) fn skipped(&mut self, skipped: SkippedSample, now: Instant) {
        self.clock = self.clock.max(now);
        match self
            .ledger
            .record(skipped.unit, skipped.shard, skipped.index)
        {
            Verdict::Accept => {
                // Named one by one at first, then counted: a large damaged dataset must not
                // bury the rest of the log.
                let n = self.skips_logged;
                self.skips_logged += 1;
                if !self.delivered_any {
                    if n < SKIPS_NAMED {
                        let held = (skipped.shard, skipped.key.clone(), skipped.reason.clone());
                        self.skips_held.push(held);
                    }
                } else if n < SKIPS_NAMED || (n + 1) % SKIPS_SUMMARY_EVERY == 0 {
                    warn_skip(n, skipped.shard, &skipped.key, &skipped.reason);
                } else if n == SKIPS_NAMED {
                    tracing::warn!(
                        "more samples skipped; from here every \
                                    {SKIPS_SUMMARY_EVERY}th is logged (each batch lists its own)"
                    );
                }
                metrics::counter!("sluice_client_skipped_total").increment(1);
                let arrival = Arrival::Skip {
                    id: SampleId {
                        shard: skipped.shard,
                        index: skipped.index,
                    },
                    reason: format!("{}: {}", skipped.key, skipped.reason),
                    unit: skipped.unit,
                };
                self.place(skipped.unit, skipped.index, arrival, now);
            }
            Verdict::Duplicate => {
                self.counters.duplicates.fetch_add(1, Ordering::Relaxed);
            }
            Verdict::Unplanned => {}
        }
    }

    /// A piece ended on `link`: done (`error` is `None`) or failed. Whatever it left is
    /// requeued; too many failures of one unit end the epoch.
    pub(crate) fn piece_ended(
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
            if f.0 >= self.settings.config.max_unit_attempts {
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
        self.release_if_drained(link, self.clock);
        Ok(())
    }

    /// A link's connection `generation` is gone: its open pieces go back to the queue.
    pub(crate) fn lost(&mut self, link: usize, generation: u64, error: String, now: Instant) {
        self.clock = self.clock.max(now);
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
        self.release_if_drained(link, now);
        if self.alive() == 0 && self.down_since.is_none() {
            self.down_since = Some(now);
        }
    }

    /// Leaves `link` out for the rest of the epoch (it refused the handshake); how many
    /// links are still in.
    pub(crate) fn exclude(&mut self, link: usize) -> usize {
        if let Some(l) = self.links.get_mut(link) {
            l.excluded = true;
        }
        self.links
            .iter()
            .filter(|l| !l.excluded && !l.released)
            .count()
    }

    fn last_errors(&self) -> String {
        let errors: Vec<String> = self
            .links
            .iter()
            .filter(|l| !l.released)
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
    ///
    /// Without shard caches a link takes the front piece. With them (a worker announced one),
    /// shard affinity ([`crate::affinity`]): a link takes the first queued piece its worker
    /// owns (or whose owner is down); only when it has none, the piece holding the sample the
    /// consumer waits for (in arrival order, any piece), once the consumer has waited
    /// [`AFFINITY_WAIT`] and if its owner is connected with no free slot. The pieces of an
    /// owner still connecting wait for it (until it connects or fails, within
    /// `connect_timeout`). Units stay
    /// within `units_per_worker` per link and the lookahead, as without affinity, so an
    /// owner's units always finish and free its slots.
    fn dispatch(&mut self) {
        if self.held {
            return;
        }
        let next = self.reorder.next_position();
        let lookahead = self.settings.config.lookahead;
        let horizon = next.map_or(u64::MAX, |n| n.saturating_add(lookahead));
        // Needed now: the piece holding the sample the consumer waits for.
        let awaited = next.map_or(u64::MAX, |n| n.saturating_add(1));
        let slots = self.settings.config.units_per_worker;
        loop {
            let mut free: Vec<usize> = (0..self.links.len())
                .filter(|&i| {
                    let l = &self.links[i];
                    l.generation.is_some() && !l.leaving && l.open.len() < slots
                })
                .collect();
            free.sort_by_key(|&i| self.links[i].open.len());
            let picked = free
                .into_iter()
                .find_map(|i| self.take_piece_for(i, horizon, awaited).map(|p| (i, p)));
            let Some((i, piece)) = picked else {
                return;
            };
            self.send_piece(i, piece);
        }
    }

    /// The piece link `link` runs next (see [`Self::dispatch`]), taken off the queue.
    fn take_piece_for(&mut self, link: usize, horizon: u64, awaited: u64) -> Option<Piece> {
        if !self.affinity {
            let Reverse(front) = self.queue.peek()?;
            return (front.priority < horizon)
                .then(|| self.queue.pop().map(|Reverse(p)| p))
                .flatten();
        }
        let views: Vec<LinkView> = self
            .links
            .iter()
            .map(|l| LinkView {
                up: l.generation.is_some(),
                failed: l.last_error.is_some() || l.excluded,
                open: l.open.len(),
            })
            .collect();
        let slots = self.settings.config.units_per_worker;
        let mine = self.owners.worker(link);
        // The first piece this worker owns (or whose owner is down), else the one the
        // consumer waits for, if its owner is connected with every slot busy.
        let mut looked: Vec<(Piece, Owner)> = Vec::new();
        let mut stealable = None;
        let mut own = None;
        while let Some(&Reverse(p)) = self.queue.peek() {
            if p.priority >= horizon || looked.len() >= AFFINITY_SCAN {
                break;
            }
            self.queue.pop();
            let owner = self.owners.owner(p.unit, &views);
            match owner {
                Owner::Down => own = Some(looked.len()),
                Owner::Up(w) | Owner::Coming(w) if w == mine => own = Some(looked.len()),
                Owner::Up(w) if self.owners.has_room(w, &views, slots) => {}
                // Still connecting: its shards wait for it (until it connects, or fails within
                // `connect_timeout` and is down).
                Owner::Coming(_) => {}
                Owner::Up(_) => {
                    // The consumer waits for it: its owner had `AFFINITY_WAIT` to take it.
                    let waited = self.clock >= self.progressed + AFFINITY_WAIT;
                    if stealable.is_none() && p.priority < awaited && waited {
                        stealable = Some(looked.len());
                    }
                }
            }
            looked.push((p, owner));
            if own.is_some() {
                break;
            }
        }
        if let (None, Some(i)) = (own, stealable) {
            let (p, owner) = &looked[i];
            tracing::debug!(
                unit = p.unit,
                to = %self.links[link].name,
                ?owner,
                "shard affinity: another worker takes the awaited unit (its owner is busy)"
            );
            self.counters.elsewhere.fetch_add(1, Ordering::Relaxed);
        }
        let mut looked: Vec<Piece> = looked.into_iter().map(|(p, _)| p).collect();
        let chosen = own.or(stealable).map(|i| looked.remove(i));
        for p in looked {
            self.queue.push(Reverse(p));
        }
        chosen
    }

    /// Gives `piece` to link `i`.
    fn send_piece(&mut self, i: usize, piece: Piece) {
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
                urls: shard.urls(),
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
        self.stats.set_in_flight(i, link.open.len());
        self.actions
            .push_back(Action::Assign(i, generation, assign));
    }

    /// A sample consumed one credit of `link`; give credits back in small batches.
    fn used_credit(&mut self, link: usize) {
        let window = self.credit_window;
        let l = &mut self.links[link];
        l.outstanding = l.outstanding.saturating_sub(1);
        l.owed += 1;
        if let Some(g) = l.generation {
            if l.owed >= (window / 4).max(1) {
                let n = std::mem::take(&mut l.owed);
                l.outstanding += n;
                self.actions.push_back(Action::Credit(link, g, n));
            }
        }
    }

    /// Puts an accepted arrival in its place: the batch being filled if its turn has come,
    /// else the holding area; then lets out whatever has become due.
    fn place(&mut self, unit: u64, index: u64, arrival: Arrival<P>, now: Instant) {
        if let Placement::Now(a) = self.reorder.offer(unit, index, arrival) {
            self.fill(a, now);
        }
        self.release(now);
    }

    /// Fills batches with held arrivals whose turn has come.
    fn release(&mut self, now: Instant) {
        loop {
            let draining = self.ledger.is_complete();
            let Some(a) = self.reorder.release(draining) else {
                break;
            };
            self.fill(a, now);
        }
        let (held, peak) = self.reorder.held();
        self.counters
            .reorder_peak
            .fetch_max(peak as u64, Ordering::Relaxed);
        metrics::gauge!("sluice_client_reorder_held_samples").set(held as f64);
    }

    fn fill(&mut self, arrival: Arrival<P>, now: Instant) {
        self.actions.push_back(Action::Fill(arrival));
        self.progressed = now;
        self.in_batch += 1;
        if self.in_batch >= self.settings.batch_plan.target(self.next_batch) {
            self.actions.push_back(Action::Close);
            self.in_batch = 0;
            self.next_batch += 1;
        }
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
}

/// When the delivery order needs samples `start..end` of `unit`: their earliest position in
/// plan order, `None` in arrival order.
fn priority<P>(reorder: &Reorder<P>, unit: u64, start: u64, end: u64) -> Option<u64> {
    match reorder {
        Reorder::Plan { sequence, .. } => {
            sequence.first_position_in(u32::try_from(unit).ok()?, start, end)
        }
        Reorder::Arrival { .. } => None,
    }
}

mod hedge;

/// The log line of the epoch's `n`-th skip (from 0).
fn warn_skip(n: u64, shard: u32, key: &str, reason: &str) {
    tracing::warn!(shard, key = %key, "sample skipped ({} in this epoch so far): {reason}", n + 1);
}

#[cfg(test)]
mod paired;
mod places;
#[cfg(test)]
pub(crate) mod world;
