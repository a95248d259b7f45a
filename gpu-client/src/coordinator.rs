//! One epoch's coordinator: the async shell around the client's [`Protocol`]. It feeds the
//! protocol what links report and the time, and carries out its actions: commands to links,
//! ring buffers filled with the samples it lets out (in the delivery order), finished batches
//! to the consumer. Every decision (assignment, credits, the ledger, the reorder area,
//! reassignment, hedging) is the protocol's; see `crate::protocol`.
//!
//! It runs as one task; its only waits are for an event, a free batch buffer (to fill, or to
//! bind ahead as soon as one is free), the earlier epoch's ring, room in the consumer's queue
//! or a link's command queue, or the protocol's next deadline.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_shard::Manifest;
use sluice_wire::Place;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::arena::{Arena, ArenaAllocator, PlaceGrant};
use crate::assembly::{self, Assembly, Landing, Settle};
use crate::batch::Batch;
use crate::batch::{BatchPlan, Filling, HostAllocator, HostMemory, Ring, ShortBatch};
use crate::clock::{now, sleep_until};
use crate::config::EpochSettings;
use crate::error::ClientError;
use crate::ledger::Ledger;
use crate::link::Event;
use crate::protocol::{Action, Protocol, Tensor};
use crate::reorder::{Arrival, Reorder};
use crate::same_host::{Payload, Segments};
use crate::session::Command;
use crate::stats::{EpochCounters, Stats};

/// How long an epoch in a shared ring waits for a buffer while its consumer waits for it,
/// before it grows the ring (see [`acquire_shared`]).
const GROW_AFTER: Duration = Duration::from_millis(50);

/// The link between an epoch and the next one, started early (`prefetch_next_epoch`): the
/// next epoch assigns its first units only once this one has handed out all of its own, so
/// it never takes a worker's unit slot from this one, and fills its first batch only once
/// this one has taken the buffer of its last, in this one's ring: the two epochs share the
/// ring's buffers, and the ring buffers this epoch still needs are never taken from it.
/// Made by [`handoff`]; the earlier epoch's coordinator holds the [`Successor`] half.
pub(crate) struct Successor {
    dispatched: CancellationToken,
    ended: CancellationToken,
    ring: Option<tokio::sync::oneshot::Sender<Arc<Ring>>>,
}

/// The later epoch's half of [`handoff`].
pub(crate) struct Predecessor {
    dispatched: CancellationToken,
    ended: CancellationToken,
    ring: Option<tokio::sync::oneshot::Receiver<Arc<Ring>>>,
}

pub(crate) fn handoff() -> (Successor, Predecessor) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let dispatched = CancellationToken::new();
    let ended = CancellationToken::new();
    (
        Successor {
            dispatched: dispatched.clone(),
            ended: ended.clone(),
            ring: Some(tx),
        },
        Predecessor {
            dispatched,
            ended,
            ring: Some(rx),
        },
    )
}

impl Successor {
    /// This epoch has handed out all of its units: the next may assign its own.
    fn dispatched(&self) {
        self.dispatched.cancel();
    }

    /// This epoch has taken its last ring buffer: the next may fill from the same ring.
    fn ring(&mut self, ring: &Arc<Ring>) {
        if let Some(tx) = self.ring.take() {
            let _ = tx.send(ring.clone());
        }
    }
}

impl Drop for Successor {
    /// An epoch that ends (finished, failed or cancelled) lets the next one go; a ring not
    /// handed over by then is not handed over (the next one makes its own).
    fn drop(&mut self) {
        self.dispatched.cancel();
        self.ended.cancel();
    }
}

impl Predecessor {
    /// Cancelled when the earlier epoch's coordinator has ended.
    pub(crate) fn ended_token(&self) -> CancellationToken {
        self.ended.clone()
    }
}

/// A batch bound to a ring buffer: its filling, the first place of its buffer in the batch
/// arena (if it is there), and the samples whose place in it a worker may still write, put
/// off until the batch closes.
pub(crate) struct Bound {
    filling: Filling,
    first: Option<u32>,
    deferred: Vec<(usize, Payload)>,
}

impl Bound {
    /// Puts a sample in the next place of the batch where [`assembly::landing`] says:
    /// copied (nothing to copy when the worker wrote it there), or put off.
    fn push(
        &mut self,
        tensor: Payload,
        id: crate::batch::SampleId,
        unit: u64,
        meta: crate::batch::SampleMeta,
        arena: Option<&Arena>,
    ) {
        let at = self.filling.len();
        let written_at = match &tensor {
            Payload::Placed { place, .. } => Some(*place),
            _ => None,
        };
        let first = self.first.filter(|_| arena.is_some());
        let owned = |p: u32| arena.is_some_and(|a| a.owned(p..p + 1));
        match assembly::landing(first, at, written_at, owned) {
            Landing::Copy => self
                .filling
                .push(|slot| tensor.copy_tensor(slot), id, unit, meta),
            Landing::Defer => {
                // A tensor in its place is read now: the batch's later samples may close the
                // gap over it before this one is written.
                let tensor = match tensor {
                    Payload::Placed { arena, place } => {
                        let mut copy = vec![0u8; self.filling.sample_bytes()];
                        arena.read(place, &mut copy);
                        Payload::Bytes(copy.into())
                    }
                    other => other,
                };
                self.deferred.push((at, tensor));
                self.filling.push(|_| {}, id, unit, meta);
            }
        }
    }
}

impl Tensor for Payload {
    fn detach(self, tensor_bytes: usize) -> Self {
        Payload::detach(self, tensor_bytes)
    }

    fn spent_credit(&self) -> bool {
        !matches!(self, Payload::Placed { .. })
    }
}

pub(crate) struct Coordinator {
    protocol: Protocol<Payload>,
    /// Each link's command queue; `None` once released (its worker left the pool).
    commands: Vec<Option<mpsc::Sender<Command>>>,
    epoch: u64,
    batch_plan: BatchPlan,
    short_batch: ShortBatch,
    ring_batches: usize,
    /// This epoch's batches the consumer holds.
    held: Arc<crate::batch::Held>,
    shape: Option<sluice_wire::SampleShape>,
    ring: Option<Arc<Ring>>,
    allocator: Arc<dyn HostAllocator>,
    /// The batch being filled.
    filling: Option<Bound>,
    /// Batches after it already bound to ring buffers (their samples may be written straight
    /// into them), in order.
    ahead: VecDeque<Bound>,
    /// The loader's same-host segments (where the batch arena is); `None`: batches are
    /// filled by copies.
    arena_source: Option<Arc<Segments>>,
    /// The batch arena this epoch's ring draws from, once the ring is made.
    arena: Option<Arc<Arena>>,
    next_batch: u64,
    counters: Arc<EpochCounters>,
    stats: Arc<Stats>,
    /// The ring of the epoch before, handed over once it has taken its last buffer (an epoch
    /// started early); `None`: this epoch makes its ring when the first worker is ready.
    earlier_ring: Option<tokio::sync::oneshot::Receiver<Arc<Ring>>>,
    /// The ring is the earlier epoch's.
    shared_ring: bool,
    /// Cancelled when the earlier epoch has handed out all its units (this one's wait).
    earlier_dispatched: Option<CancellationToken>,
    successor: Option<Successor>,
    /// The fields asked for by name, which every batch lists.
    requested: Arc<[String]>,
}

impl Coordinator {
    pub(crate) fn new(
        settings: EpochSettings,
        manifest: Arc<Manifest>,
        (ledger, reorder): (Ledger, Reorder<Payload>),
        links: Vec<(String, mpsc::Sender<Command>)>,
        allocator: Arc<dyn HostAllocator>,
        counters: Arc<EpochCounters>,
        stats: Arc<Stats>,
    ) -> Self {
        let (names, commands): (Vec<String>, Vec<mpsc::Sender<Command>>) =
            links.into_iter().unzip();
        Coordinator {
            epoch: settings.epoch,
            batch_plan: settings.batch_plan,
            short_batch: settings.config.short_batch,
            requested: match &settings.config.fields {
                sluice_wire::FieldSelection::Named(names) => names.as_slice().into(),
                _ => Arc::from([]),
            },
            ring_batches: settings.config.ring_batches,
            held: Arc::default(),
            next_batch: settings.first_batch,
            protocol: Protocol::new(
                settings,
                manifest,
                (ledger, reorder),
                names,
                (counters.clone(), stats.clone()),
                now(),
            ),
            commands: commands.into_iter().map(Some).collect(),
            shape: None,
            ring: None,
            allocator,
            filling: None,
            ahead: VecDeque::new(),
            arena_source: None,
            arena: None,
            counters,
            stats,
            earlier_ring: None,
            shared_ring: false,
            earlier_dispatched: None,
            successor: None,
        }
    }

    /// Same-host workers may write samples straight into batches of the loader's batch
    /// arena, when the loader has one.
    pub(crate) fn with_arena(mut self, segments: Arc<Segments>) -> Self {
        self.arena_source = Some(segments);
        self
    }

    /// This epoch was started early: its links connect now, its units go out once `earlier`
    /// has handed out all of its own, and it fills batches from `earlier`'s ring once that
    /// epoch has taken its last buffer.
    pub(crate) fn after(mut self, mut earlier: Predecessor) -> Self {
        self.earlier_ring = earlier.ring.take();
        self.protocol.hold();
        self.earlier_dispatched = Some(earlier.dispatched.clone());
        self
    }

    /// The next epoch is started early, behind this one.
    pub(crate) fn before(mut self, next: Successor) -> Self {
        self.successor = Some(next);
        self
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
        match result {
            // A loop that leaves an epoch early (`break`) drops it: nothing went wrong.
            Err(ClientError::ConsumerGone) => {
                tracing::debug!(epoch = self.epoch, "the consumer left the epoch early");
            }
            // An epoch cancelled (a loop's `break`, a dropped loader) takes its links with it:
            // what that looks like from here (links ended, a send to a closed channel) is no
            // error.
            Err(e) if cancel.is_cancelled() || out.is_closed() => {
                tracing::debug!(epoch = self.epoch, "the epoch ended early ({e})");
            }
            Err(e) => {
                self.counters.failed.store(true, Ordering::Relaxed);
                tracing::error!(epoch = self.epoch, "{e}");
                let _ = out.send(Err(e)).await;
            }
            Ok(()) => {}
        }
        // Dropping the command senders ends every link (closing its connection).
        self.commands.clear();
        // The next epoch may go before the consumer hears that this one ended.
        self.successor = None;
    }

    async fn drive(
        &mut self,
        events: &mut mpsc::Receiver<Event>,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        loop {
            self.act(out).await?;
            if self.protocol.finished() {
                return Ok(());
            }
            if self.protocol.all_dispatched() {
                if let Some(next) = &self.successor {
                    next.dispatched();
                }
            }
            let deadline = self.protocol.poll_timeout();
            let earlier = self.earlier_dispatched.clone();
            let room = self.room_wanted();
            // The earlier epoch's ring, once the ring's shape is known.
            let handover = self.earlier_ring.as_mut().filter(|_| self.shape.is_some());
            let event = tokio::select! {
                e = events.recv() => e,
                _ = sleep_until(deadline) => {
                    self.protocol.timeout(now())?;
                    continue;
                }
                _ = gate(earlier) => {
                    self.earlier_dispatched = None;
                    self.protocol.unhold(now());
                    continue;
                }
                // Batches are bound (their places sent) as soon as there are buffers for
                // them, not when the next sample or batch happens to come: a sample that
                // arrives before its place goes through a slot and is copied.
                ring = handed_over(handover) => {
                    self.earlier_ring = None;
                    self.adopt(ring.ok())?;
                    self.bind_ahead().await;
                    continue;
                }
                _ = free_buffer(room) => {
                    self.bind_ahead().await;
                    continue;
                }
            };
            let Some(event) = event else {
                return Err(ClientError::Runtime("every link ended".into()));
            };
            self.handle(event)?;
        }
    }

    /// Feeds one link event to the protocol.
    fn handle(&mut self, event: Event) -> Result<(), ClientError> {
        let now = now();
        match event {
            Event::Ready {
                link,
                generation,
                shape,
                caches,
            } => self.protocol.ready(link, generation, shape, caches)?,
            Event::Sample {
                link,
                header,
                payload,
                fields,
            } => self.protocol.sample(link, header, payload, fields, now),
            Event::Skipped { skipped } => self.protocol.skipped(skipped, now),
            Event::UnitDone { link, done } => {
                self.stats
                    .shard_bytes(done.storage_bytes, done.cached_bytes);
                let c = &self.counters;
                c.storage_bytes
                    .fetch_add(done.storage_bytes, Ordering::Relaxed);
                c.cached_bytes
                    .fetch_add(done.cached_bytes, Ordering::Relaxed);
                self.protocol
                    .piece_ended(link, done.unit, done.attempt, None)?
            }
            Event::UnitFailed { link, failed } => {
                self.protocol
                    .piece_ended(link, failed.unit, failed.attempt, Some(failed.error))?
            }
            Event::Joined {
                link,
                name,
                commands,
            } => {
                let at = self.protocol.join(name.clone());
                if at != link || self.commands.len() != link {
                    return Err(ClientError::Runtime(format!(
                        "worker {name} joined as link {link}, expected {at}"
                    )));
                }
                self.stats.joined(link, &name);
                self.commands.push(Some(commands));
            }
            Event::Left { link } => {
                self.stats.left(link);
                self.protocol.leave(link, now);
            }
            Event::Lost {
                link,
                generation,
                error,
                fatal,
            } => {
                self.protocol.lost(link, generation, error, now);
                if let Some(f) = fatal {
                    // A worker that refuses the handshake (another certificate, token or
                    // protocol version) is left out; the epoch goes on with the others.
                    let left = self.protocol.exclude(link);
                    if left == 0 {
                        return Err(f);
                    }
                    tracing::error!(
                        epoch = self.epoch,
                        "{f}; left out of this epoch, which \
                        goes on with {left} other worker connection(s)"
                    );
                }
            }
        }
        Ok(())
    }

    /// Carries out the protocol's actions, in order.
    async fn act(
        &mut self,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        while let Some(action) = self.protocol.poll_action() {
            match action {
                Action::Assign(link, generation, assign) => {
                    let places = match &self.arena {
                        Some(_) => {
                            let bound = self.bound_batches();
                            let first =
                                |b: u64| bound.iter().find(|(k, _)| *k == b).map(|(_, f)| *f);
                            self.protocol.piece_places(&assign, first)
                        }
                        None => Vec::new(),
                    };
                    send(self.link(link), Command::Assign(generation, assign)).await;
                    self.send_places(places.into_iter().map(|p| (link, generation, p)))
                        .await;
                }
                Action::Credit(link, generation, n) => {
                    send(self.link(link), Command::Credit(generation, n)).await;
                }
                Action::Drain(link) => send(self.link(link), Command::Drain).await,
                // Dropping its command queue ends the link and closes its connection.
                Action::Release(link) => {
                    if let Some(c) = self.commands.get_mut(link) {
                        *c = None;
                    }
                }
                Action::Ring(shape) => {
                    self.shape = Some(shape);
                    if let Some(segments) = &self.arena_source {
                        self.arena = segments.made_arena(shape.bytes());
                    }
                    // An epoch started early waits for the earlier one's ring instead.
                    if self.earlier_ring.is_none() {
                        self.ring = Some(self.new_ring()?);
                    }
                    // Batches bound before the first units are assigned give those units'
                    // samples their places with the assignment.
                    self.bind_ahead().await;
                }
                Action::Fill(Arrival::Sample {
                    id,
                    unit,
                    tensor,
                    meta,
                }) => {
                    let arena = self.arena.clone();
                    self.filling()
                        .await?
                        .push(tensor, id, unit, meta, arena.as_deref());
                    self.bind_ahead().await;
                }
                Action::Fill(Arrival::Skip { id, reason, unit }) => {
                    self.filling().await?.filling.skip(id, reason, unit)
                }
                Action::Close => {
                    self.close(out).await?;
                    self.bind_ahead().await;
                }
            }
        }
        Ok(())
    }

    /// Link `link`'s command queue, unless it is released.
    fn link(&self, link: usize) -> Option<mpsc::Sender<Command>> {
        self.commands.get(link).cloned().flatten()
    }

    fn batch_bytes(&self) -> usize {
        self.shape.map_or(0, |s| s.bytes() as usize) * self.batch_plan.batch_size as usize
    }

    /// Waits while the consumer holds as many batches as [`Assembly::hold_limit`] lets it.
    async fn until_consumer_may_hold_another(&mut self) {
        let Some(limit) = self.assembly().hold_limit(self.shared_ring) else {
            return;
        };
        if self.held.now() < limit {
            return;
        }
        self.waiting_for_a_buffer(true);
        self.held.until_below(limit).await;
        self.waiting_for_a_buffer(false);
    }

    /// Says whether the coordinator waits for the consumer to free a ring buffer, and with
    /// it whether the consumer holds every one of the ring's batches (the epoch's short
    /// grace before `RingExhausted`).
    fn waiting_for_a_buffer(&self, waiting: bool) {
        let all = waiting && self.held.now() >= self.ring_batches;
        self.counters.held_all.store(all, Ordering::Relaxed);
        self.counters.ring_full.store(waiting, Ordering::Relaxed);
    }

    fn ring_buffers(&self) -> usize {
        self.assembly().ring_buffers()
    }

    /// How this epoch assembles its batches (known once the ring's arena is).
    fn assembly(&self) -> Assembly {
        Assembly {
            batches: self.batch_plan.batches,
            ring_batches: self.ring_batches,
            ahead_max: self.arena.as_ref().map_or(0, |a| a.ahead()),
        }
    }

    /// Where the ring's buffers come from: the batch arena while it has free ones.
    fn ring_allocator(&self) -> Arc<dyn HostAllocator> {
        match &self.arena {
            Some(arena) => Arc::new(ArenaAllocator {
                arena: arena.clone(),
                fallback: self.allocator.clone(),
            }),
            None => self.allocator.clone(),
        }
    }

    fn new_ring(&self) -> Result<Arc<Ring>, ClientError> {
        Ring::new(
            &*self.ring_allocator(),
            self.ring_buffers(),
            self.batch_bytes(),
        )
        .map_err(ClientError::Allocate)
    }

    /// The batches bound to buffers now (the one being filled and those ahead), with the
    /// first place of each one that is in the batch arena.
    fn bound_batches(&self) -> Vec<(u64, u32)> {
        self.filling
            .iter()
            .chain(&self.ahead)
            .filter_map(|b| Some((b.filling.index(), b.first?)))
            .collect()
    }

    /// A filling for batch `index` in `buf`, and, in the arena, its samples' places sent to
    /// the workers that hold them.
    async fn bind(&mut self, buf: Box<dyn HostMemory>, ring: Arc<Ring>, index: u64) -> Bound {
        let first = self
            .arena
            .as_ref()
            .and_then(|a| a.first_place(buf.as_slice()));
        let shape = self.shape.unwrap_or(sluice_wire::SampleShape {
            frames: 1,
            height: 0,
            width: 0,
            channels: 0,
            elem_bytes: 0,
            chw: false,
        });
        let target = self.batch_plan.target(index);
        let filling = Filling::new(
            buf,
            ring,
            shape,
            (self.epoch, index),
            target,
            self.requested.clone(),
        );
        if let (Some(first), Some(_)) = (first, &self.arena) {
            let places = self.protocol.batch_places(index, first);
            self.send_places(places.into_iter()).await;
        }
        Bound {
            filling,
            first,
            deferred: Vec::new(),
        }
    }

    /// Binds free ring buffers to the batches [`Assembly::bind_next`] names, without
    /// waiting for one.
    async fn bind_ahead(&mut self) {
        let Some(ring) = self.ring.clone() else {
            return;
        };
        while let Some(index) = self.next_to_bind() {
            let Some(buf) = ring.try_acquire() else {
                return;
            };
            if self.assembly().is_last(index) {
                if let Some(next) = &mut self.successor {
                    next.ring(&ring);
                }
            }
            let bound = self.bind(buf, ring.clone(), index).await;
            self.ahead.push_back(bound);
        }
    }

    /// Reserves `places` in the arena and sends each link those of its connection.
    async fn send_places(&mut self, places: impl Iterator<Item = (usize, u64, Place)>) {
        let Some(arena) = &self.arena else { return };
        let mut by_link: Vec<((usize, u64), Vec<Place>)> = Vec::new();
        for (link, generation, place) in places {
            match by_link.iter_mut().find(|(k, _)| *k == (link, generation)) {
                Some((_, v)) => v.push(place),
                None => by_link.push(((link, generation), vec![place])),
            }
        }
        for ((link, generation), places) in by_link {
            let reserved = arena.reserve(places);
            arena.populate(&reserved);
            let grant = PlaceGrant::new(arena.clone(), reserved);
            if !grant.places().is_empty() {
                // Dropped unsent (the link is gone), the grant gives its places back.
                send(self.link(link), Command::Places(generation, grant)).await;
            }
        }
    }

    /// The ring, in an epoch started early the earlier epoch's once it has taken its last
    /// buffer (or a new one, if it ended without handing it over).
    async fn ring(&mut self) -> Result<Arc<Ring>, ClientError> {
        let earlier = self.earlier_ring.take_if(|_| self.shape.is_some());
        if let Some(earlier) = earlier {
            self.adopt(earlier.await.ok())?;
        }
        self.ring
            .clone()
            .ok_or_else(|| ClientError::Runtime("a sample before any worker was ready".into()))
    }

    /// Takes the ring the earlier epoch handed over when its buffers fit this epoch's
    /// batches, or makes one (`earlier` is `None` when that epoch ended without handing it
    /// over).
    fn adopt(&mut self, earlier: Option<Arc<Ring>>) -> Result<(), ClientError> {
        let ring = match earlier {
            Some(r) if r.fits(self.ring_buffers(), self.batch_bytes()) => {
                self.shared_ring = true;
                r
            }
            _ => self.new_ring()?,
        };
        self.ring = Some(ring);
        Ok(())
    }

    /// The ring, when [`Self::bind_ahead`] would bind a batch to a buffer as soon as one is
    /// free.
    fn room_wanted(&self) -> Option<Arc<Ring>> {
        self.next_to_bind().and(self.ring.clone())
    }

    /// The batch to bind a free buffer to ahead of the one being filled, if one should be
    /// ([`Assembly::bind_next`]; only in the batch arena).
    fn next_to_bind(&self) -> Option<u64> {
        let reached = self.arena.as_ref()?.reach(self.protocol.batches_reached());
        self.assembly().bind_next(
            self.next_batch,
            self.filling.is_some(),
            self.ahead.len(),
            reached,
        )
    }

    /// The batch being filled, waiting for a free ring buffer if there is none.
    async fn filling(&mut self) -> Result<&mut Bound, ClientError> {
        if self.filling.is_none()
            && self
                .ahead
                .front()
                .is_some_and(|b| b.filling.index() == self.next_batch)
        {
            self.filling = self.ahead.pop_front();
        }
        if self.filling.is_none() {
            let started = Instant::now();
            let ring = self.ring().await?;
            self.waiting_for_a_buffer(true);
            let buf = match self.shared_ring {
                false => ring.acquire().await,
                true => acquire_shared(&ring, &self.counters, self.allocator.clone()).await?,
            };
            self.waiting_for_a_buffer(false);
            self.stats.ring_wait(started.elapsed());
            // Time spent waiting for the consumer is not the workers' delay.
            self.protocol.waited(now());
            if self.assembly().is_last(self.next_batch) {
                if let Some(next) = &mut self.successor {
                    next.ring(&ring);
                }
            }
            let bound = self.bind(buf, ring, self.next_batch).await;
            self.filling = Some(bound);
        }
        self.filling
            .as_mut()
            .ok_or_else(|| ClientError::Runtime("no batch".into()))
    }

    /// The batch's own buffer, safe to hand the consumer: samples put off are written into
    /// it; or, while a worker may still write a place in it (a stalled or lost one), a fresh
    /// buffer with the batch copied into it, the arena buffer retired until its writers are
    /// done.
    fn settle(&self, bound: Bound) -> Result<Filling, ClientError> {
        let Bound {
            mut filling,
            first,
            deferred,
        } = bound;
        let (Some(first), Some(arena)) = (first, &self.arena) else {
            return Ok(filling);
        };
        let n = self.shape.map_or(0, |s| s.bytes() as usize);
        let size = self.batch_plan.batch_size as u32;
        if assembly::settle(Some(first), size, |r| arena.owned(r)) == Settle::InPlace {
            if let Some(buf) = filling.buffer_mut() {
                for (i, payload) in &deferred {
                    payload.copy_tensor(&mut buf[i * n..(i + 1) * n]);
                }
            }
            return Ok(filling);
        }
        tracing::debug!(
            batch = filling.index(),
            "a worker may still write this batch's buffer: copied into a fresh one"
        );
        let mut fresh = self
            .allocator
            .allocate(self.batch_bytes())
            .map_err(ClientError::Allocate)?;
        if let Some(old) = filling.buffer() {
            let dst = fresh.as_mut_slice();
            for i in 0..filling.len() {
                let to = &mut dst[i * n..(i + 1) * n];
                match deferred.iter().find(|(at, _)| *at == i) {
                    Some((_, payload)) => payload.copy_tensor(to),
                    // Filled, so its place is settled.
                    None => to.copy_from_slice(&old[i * n..(i + 1) * n]),
                }
            }
        }
        // The arena buffer goes back, retired while a place in it is owned.
        drop(filling.replace_buffer(fresh));
        Ok(filling)
    }

    /// Finishes the batch being filled and hands it to the consumer.
    async fn close(
        &mut self,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        // A batch of skips only still takes its place in the epoch.
        let f = match self.filling.take() {
            Some(f) => f,
            None => {
                self.filling().await?;
                self.filling
                    .take()
                    .ok_or_else(|| ClientError::Runtime("no batch".into()))?
            }
        };
        debug_assert!(
            f.filling.is_full(),
            "the protocol closed a batch before it was full"
        );
        self.until_consumer_may_hold_another().await;
        let batch = self.settle(f)?.finish(self.short_batch, &self.held);
        self.next_batch += 1;
        if out.send(Ok(batch)).await.is_err() {
            return Err(ClientError::ConsumerGone);
        }
        Ok(())
    }
}

/// A free buffer of `ring`, a ring taken over from the epoch before. The consumer may still
/// hold that epoch's batches while it waits for this one's: then, rather than wait for
/// ever, the ring grows by a buffer, up to twice its size (what a ring of this epoch's own
/// would have cost); beyond, the consumer's wait ends in `RingExhausted` as in any ring.
async fn acquire_shared(
    ring: &Ring,
    counters: &EpochCounters,
    allocator: Arc<dyn HostAllocator>,
) -> Result<Box<dyn HostMemory>, ClientError> {
    loop {
        tokio::select! {
            buf = ring.acquire() => return Ok(buf),
            _ = tokio::time::sleep(GROW_AFTER) => {
                if counters.consumer_waiting.load(Ordering::Relaxed) {
                    if let Some(buf) = ring.grow(&*allocator) {
                        tracing::debug!("the consumer holds the shared ring's buffers: one more");
                        return buf.map_err(ClientError::Allocate);
                    }
                }
            }
        }
    }
}

/// The ring the earlier epoch hands over (`Err`: it ended without); never, without one.
async fn handed_over(
    earlier: Option<&mut tokio::sync::oneshot::Receiver<Arc<Ring>>>,
) -> Result<Arc<Ring>, tokio::sync::oneshot::error::RecvError> {
    match earlier {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Returns once `ring` has a free buffer; never, without a ring.
async fn free_buffer(ring: Option<Arc<Ring>>) {
    match ring {
        Some(r) => r.until_free().await,
        None => std::future::pending().await,
    }
}

/// Sends `command` down a link's queue, if it has one. A send fails only when the link task
/// ended; its loss event requeues.
async fn send(link: Option<mpsc::Sender<Command>>, command: Command) {
    if let Some(tx) = link {
        let _ = tx.send(command).await;
    }
}

/// Waits until `earlier` is cancelled; for ever when there is none.
async fn gate(earlier: Option<CancellationToken>) {
    match earlier {
        Some(t) => t.cancelled().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
pub(crate) mod simulation;

#[cfg(test)]
mod tests;
