//! One epoch's coordinator: the async shell around the client's [`Protocol`]. It feeds the
//! protocol what links report and the time, and carries out its actions: commands to links,
//! ring buffers filled with the samples it lets out (in the delivery order), finished batches
//! to the consumer. Every decision (assignment, credits, the ledger, the reorder area,
//! reassignment, hedging) is the protocol's; see `crate::protocol`.
//!
//! It runs as one task; its only waits are for an event, a free batch buffer (to fill, or to
//! bind ahead as soon as one is free), the earlier epoch's ring, room in the consumer's queue
//! or a link's command queue, or the protocol's next deadline.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_shard::Manifest;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::arena::Arena;
use crate::assembly::Assembly;
use crate::batch::{Batch, BatchPlan, HostAllocator, Ring, ShortBatch};
use crate::clock::{now, sleep_until};
use crate::config::EpochSettings;
use crate::error::ClientError;
use crate::ledger::Ledger;
use crate::link::Event;
use crate::protocol::{Action, Protocol};
use crate::reorder::{Arrival, Reorder};
use crate::same_host::{Payload, Segments};
use crate::session::Command;
use crate::stats::{EpochCounters, Stats};

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
    /// The batches bound to ring buffers, and what to bind next.
    assembly: Assembly,
    /// The loader's same-host segments (where the batch arena is); `None`: batches are
    /// filled by copies.
    arena_source: Option<Arc<Segments>>,
    /// The batch arena this epoch's ring draws from, once the ring is made.
    arena: Option<Arc<Arena>>,
    counters: Arc<EpochCounters>,
    stats: Arc<Stats>,
    /// The ring of the epoch before, handed over once it has taken its last buffer (an epoch
    /// started early); `None`: this epoch makes its ring when the first worker is ready.
    earlier_ring: Option<tokio::sync::oneshot::Receiver<Arc<Ring>>>,
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
            assembly: Assembly::new(
                settings.batch_plan.batches,
                settings.config.ring_batches,
                settings.first_batch,
            ),
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
            arena_source: None,
            arena: None,
            counters,
            stats,
            earlier_ring: None,
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
                ring = buffers::handed_over(handover) => {
                    self.earlier_ring = None;
                    self.adopt(ring.ok())?;
                    self.bind_ahead().await;
                    continue;
                }
                _ = buffers::free_buffer(room) => {
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
                            let bound = self.assembly.bound_batches();
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
                    if let Some(arena) = &self.arena {
                        self.assembly.in_arena(arena.ahead());
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
                        .push(tensor, (id, unit, meta), arena.as_deref());
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

    /// Finishes the batch being filled and hands it to the consumer.
    async fn close(
        &mut self,
        out: &mpsc::Sender<Result<Batch, ClientError>>,
    ) -> Result<(), ClientError> {
        // A batch of skips only still takes its place in the epoch.
        self.filling().await?;
        self.until_consumer_may_hold_another().await;
        let arena = self.arena.clone();
        let owned = |places| arena.as_ref().is_some_and(|a| a.owned(places));
        let size = self.batch_plan.batch_size as u32;
        let (bound, settle) = (self.assembly.close(size, owned))
            .ok_or_else(|| ClientError::Runtime("no batch".into()))?;
        let batch = self
            .settle(bound, settle)?
            .finish(self.short_batch, &self.held);
        if out.send(Ok(batch)).await.is_err() {
            return Err(ClientError::ConsumerGone);
        }
        Ok(())
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

mod buffers;
mod handoff;
pub(crate) use handoff::{handoff, Predecessor, Successor};

#[cfg(test)]
pub(crate) mod simulation;

#[cfg(test)]
mod tests;
