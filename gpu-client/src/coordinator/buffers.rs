//! The coordinator's ring buffers: the ring (this epoch's own, or the one the epoch before
//! hands over), the buffers bound to batches as the assembly's [`Step`]s say (with their
//! samples' places reserved in the batch arena and sent to the links that hold them), the
//! waits for a free buffer, and a closed batch settled before the consumer gets it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::Place;

use super::{send, Coordinator};
use crate::arena::{ArenaAllocator, PlaceGrant};
use crate::assembly::{Bound, Growth, Settle, Step};
use crate::batch::{Filling, HostAllocator, HostMemory, Ring};
use crate::clock::now;
use crate::error::ClientError;
use crate::session::Command;
use crate::stats::EpochCounters;

/// How long an epoch in a shared ring waits for a buffer while its consumer waits for it,
/// before it grows the ring ([`crate::assembly::Assembly::grow`]).
const GROW_AFTER: Duration = Duration::from_millis(50);

impl Coordinator {
    /// Waits while the consumer holds as many batches as the assembly lets it.
    pub(super) async fn until_consumer_may_hold_another(&mut self) {
        let Some(limit) = self.assembly.hold_limit() else {
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

    pub(super) fn new_ring(&self) -> Result<Arc<Ring>, ClientError> {
        Ring::new(
            &*self.ring_allocator(),
            self.assembly.ring_buffers(),
            self.batch_bytes(),
        )
        .map_err(ClientError::Allocate)
    }

    /// A filling for batch `index` in `buf`, and, in the arena, its samples' places sent to
    /// the workers that hold them. The buffer of the epoch's last batch lets the next epoch,
    /// started early, fill from the same ring.
    async fn bind(&mut self, buf: Box<dyn HostMemory>, ring: Arc<Ring>, index: u64) -> Bound {
        if self.assembly.is_last(index) {
            if let Some(next) = &mut self.successor {
                next.ring(&ring);
            }
        }
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
        let epoch_index = (self.epoch, index);
        let requested = self.requested.clone();
        let filling = Filling::new(buf, ring, shape, epoch_index, target, requested);
        if let (Some(first), Some(_)) = (first, &self.arena) {
            let places = self.protocol.batch_places(index, first);
            self.send_places(places.into_iter()).await;
        }
        Bound::new(filling, first)
    }

    /// Carries out the assembly's [`Step::BindAhead`]s while the ring has a free buffer,
    /// without waiting for one.
    pub(super) async fn bind_ahead(&mut self) {
        let Some(ring) = self.ring.clone() else {
            return;
        };
        while let Some(Step::BindAhead(index)) = self.next_to_bind() {
            let Some(buf) = ring.try_acquire() else {
                return;
            };
            let bound = self.bind(buf, ring.clone(), index).await;
            self.assembly.bound(bound);
        }
    }

    /// Reserves `places` in the arena and sends each link those of its connection.
    pub(super) async fn send_places(&mut self, places: impl Iterator<Item = (usize, u64, Place)>) {
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
    pub(super) fn adopt(&mut self, earlier: Option<Arc<Ring>>) -> Result<(), ClientError> {
        let ring = match earlier {
            Some(r) if r.fits(self.assembly.ring_buffers(), self.batch_bytes()) => {
                self.assembly.share_ring();
                r
            }
            _ => self.new_ring()?,
        };
        self.ring = Some(ring);
        Ok(())
    }

    /// The ring, when [`Self::bind_ahead`] would bind a batch to a buffer as soon as one is
    /// free.
    pub(super) fn room_wanted(&self) -> Option<Arc<Ring>> {
        self.next_to_bind().and(self.ring.clone())
    }

    /// The assembly's next [`Step::BindAhead`], as far ahead as the arena's reach says.
    fn next_to_bind(&self) -> Option<Step> {
        let reached = self.arena.as_ref()?.reach(self.protocol.batches_reached());
        self.assembly.bind_ahead(reached)
    }

    /// The batch being filled, waiting for a free ring buffer (the assembly's
    /// [`Step::Reserve`]) if there is none.
    pub(super) async fn filling(&mut self) -> Result<&mut Bound, ClientError> {
        if let Err(Step::Reserve(index)) = self.assembly.filling().map(|_| ()) {
            let started = Instant::now();
            let ring = self.ring().await?;
            self.waiting_for_a_buffer(true);
            let (growth, counters) = (self.assembly.growth(), self.counters.clone());
            let buf = acquire(&ring, growth, &counters, &*self.allocator).await?;
            self.waiting_for_a_buffer(false);
            self.stats.ring_wait(started.elapsed());
            // Time spent waiting for the consumer is not the workers' delay.
            self.protocol.waited(now());
            let bound = self.bind(buf, ring, index).await;
            self.assembly.bound(bound);
        }
        self.assembly
            .filling()
            .map_err(|_| ClientError::Runtime("no batch".into()))
    }

    /// The closed batch's own buffer, safe to hand the consumer as the assembly's `settle`
    /// says: samples put off written into it; or, while a worker may still write a place in
    /// it (a stalled or lost one), a fresh buffer with the batch copied into it, the arena
    /// buffer retired until its writers are done.
    pub(super) fn settle(&self, bound: Bound, settle: Settle) -> Result<Filling, ClientError> {
        let fresh = match settle {
            Settle::InPlace => None,
            Settle::Fresh => {
                tracing::debug!(
                    batch = bound.filling.index(),
                    "a worker may still write this batch's buffer: copied into a fresh one"
                );
                let fresh = self.allocator.allocate(self.batch_bytes());
                Some(fresh.map_err(ClientError::Allocate)?)
            }
        };
        Ok(bound.settle(fresh))
    }
}

/// A free buffer of `ring`. In a ring taken over from the epoch before, the consumer may
/// still hold that epoch's batches while it waits for this one's: then, rather than wait for
/// ever, the ring grows by a buffer as `growth` says; beyond its bound the consumer's wait
/// ends in `RingExhausted` as in any ring.
async fn acquire(
    ring: &Ring,
    growth: Growth,
    counters: &EpochCounters,
    allocator: &dyn HostAllocator,
) -> Result<Box<dyn HostMemory>, ClientError> {
    loop {
        tokio::select! {
            buf = ring.acquire() => return Ok(buf),
            _ = tokio::time::sleep(GROW_AFTER), if growth.may_grow() => {
                if !growth.grow(counters.consumer_waiting.load(Ordering::Relaxed)) {
                    continue;
                }
                if let Some(buf) = ring.grow(allocator) {
                    tracing::debug!("the consumer holds the shared ring's buffers: one more");
                    return buf.map_err(ClientError::Allocate);
                }
            }
        }
    }
}

/// The ring the earlier epoch hands over (`Err`: it ended without); never, without one.
pub(super) async fn handed_over(
    earlier: Option<&mut tokio::sync::oneshot::Receiver<Arc<Ring>>>,
) -> Result<Arc<Ring>, tokio::sync::oneshot::error::RecvError> {
    match earlier {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

/// Returns once `ring` has a free buffer; never, without a ring.
pub(super) async fn free_buffer(ring: Option<Arc<Ring>>) {
    match ring {
        Some(r) => r.until_free().await,
        None => std::future::pending().await,
    }
}
