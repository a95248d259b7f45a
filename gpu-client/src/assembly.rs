//! Batch assembly as a state machine with no IO: the batches bound to ring buffers (the one
//! being filled, and with a batch arena those bound ahead of it, whose samples a worker may
//! write straight into them), where each sample lands (copied, already in its place, or put
//! off because a worker may still write its place), what a closed batch needs before the
//! consumer gets it, how far a ring shared with the epoch before may grow, and how many
//! batches the consumer may hold. It says what to do as [`Step`]s; the coordinator
//! (`crate::coordinator`) awaits the buffers and carries the copies out; the arena
//! (`crate::arena`) keeps who owns each place.
//!
//! The arena's rules these serve (ARCHITECTURE.md, *No shared writer*): the client never
//! writes a place a worker owns, and never hands out a batch with one; such a batch is copied
//! into a fresh buffer and its arena buffer retired until its places are settled.

use std::collections::VecDeque;
use std::ops::Range;

use crate::arena::Arena;
use crate::batch::{Filling, HostMemory, SampleId, SampleMeta, SHARED_RING_GROWTH};
use crate::same_host::Payload;

/// What the coordinator must do for the assembly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Bind a free ring buffer, if there is one now, to batch `index` ahead of the one
    /// being filled ([`Assembly::bound`]), and reserve its samples' places.
    BindAhead(u64),
    /// Wait for a free ring buffer for batch `index`, the next to fill, and bind it
    /// ([`Assembly::bound`]); in a shared ring, [`Assembly::grow`] says when to stop
    /// waiting and grow it.
    Reserve(u64),
}

/// A sample written straight into its place in the batch arena spent no credit.
impl crate::protocol::Tensor for Payload {
    fn detach(self, tensor_bytes: usize) -> Self {
        Payload::detach(self, tensor_bytes)
    }

    fn spent_credit(&self) -> bool {
        !matches!(self, Payload::Placed { .. })
    }
}

/// Where a sample's tensor goes in the batch being filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Landing {
    /// Copied into the batch (or already there: a sample written in its own place).
    Copy,
    /// The batch's place for it may still be written by a worker (a lost or stalled one
    /// that owned it): kept aside, and written when the batch closes.
    Defer,
}

/// What a closed batch needs before the consumer gets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its buffer is its own: write the samples put off into it.
    InPlace,
    /// A worker may still write a place of its buffer: copy it into a fresh buffer (the
    /// samples put off included), and retire the arena buffer until its places settle.
    Fresh,
}

/// A batch bound to a ring buffer: its filling, the first place of its buffer in the batch
/// arena (if it is there), and the samples whose place in it a worker may still write, put
/// off until the batch closes.
pub(crate) struct Bound {
    pub(crate) filling: Filling,
    pub(crate) first: Option<u32>,
    deferred: Vec<(usize, Payload)>,
}

impl Bound {
    pub(crate) fn new(filling: Filling, first: Option<u32>) -> Self {
        Bound {
            filling,
            first,
            deferred: Vec::new(),
        }
    }

    /// Puts a sample in the next place of the batch where [`landing`] says: copied (nothing
    /// to copy when the worker wrote it there), or put off.
    pub(crate) fn push(
        &mut self,
        tensor: Payload,
        (id, unit, meta): (SampleId, u64, SampleMeta),
        arena: Option<&Arena>,
    ) {
        let at = self.filling.len();
        let written_at = match &tensor {
            Payload::Placed { place, .. } => Some(*place),
            _ => None,
        };
        let first = self.first.filter(|_| arena.is_some());
        let owned = |p: u32| arena.is_some_and(|a| a.owned(p..p + 1));
        match landing(first, at, written_at, owned) {
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

    /// The batch's own buffer made safe to hand out: the samples put off written into it
    /// ([`Settle::InPlace`]: no `fresh`), or the batch copied into `fresh` with them
    /// ([`Settle::Fresh`]), the arena buffer going back (retired while a place in it is
    /// owned).
    pub(crate) fn settle(self, fresh: Option<Box<dyn HostMemory>>) -> Filling {
        let Bound {
            mut filling,
            deferred,
            ..
        } = self;
        let n = filling.sample_bytes();
        let Some(mut fresh) = fresh else {
            if let Some(buf) = filling.buffer_mut() {
                for (i, payload) in &deferred {
                    payload.copy_tensor(&mut buf[i * n..(i + 1) * n]);
                }
            }
            return filling;
        };
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
        drop(filling.replace_buffer(fresh));
        filling
    }
}

/// How an epoch's batches are laid out on its ring.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Batches in the epoch.
    pub batches: u64,
    /// Batches the consumer may hold (the ring's size without an arena).
    pub ring_batches: usize,
    /// Batches the batch arena lets be bound ahead of the one being filled; 0 without an
    /// arena.
    pub ahead_max: usize,
}

/// Whether a batch waiting for a ring buffer grows the ring by one instead
/// ([`Assembly::growth`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Growth {
    shared: bool,
}

impl Growth {
    /// Whether the ring may grow at all: only a ring taken over from the epoch before.
    pub(crate) fn may_grow(self) -> bool {
        self.shared
    }

    /// Whether it grows now: its consumer waits for this epoch's batch while it holds the
    /// epoch before's (the ring itself stops at [`SHARED_RING_GROWTH`] times its size).
    pub(crate) fn grow(self, consumer_waiting: bool) -> bool {
        self.shared && consumer_waiting
    }
}

/// One epoch's batch assembly (see the module documentation).
pub(crate) struct Assembly {
    layout: Layout,
    /// The batch to fill next.
    next: u64,
    filling: Option<Bound>,
    /// Batches after it already bound to ring buffers, in order.
    ahead: VecDeque<Bound>,
    /// The ring is the earlier epoch's.
    shared_ring: bool,
}

impl Assembly {
    /// An epoch of `batches` batches from `first`, whose consumer may hold `ring_batches`.
    pub(crate) fn new(batches: u64, ring_batches: usize, first: u64) -> Self {
        Assembly {
            layout: Layout {
                batches,
                ring_batches,
                ahead_max: 0,
            },
            next: first,
            filling: None,
            ahead: VecDeque::new(),
            shared_ring: false,
        }
    }

    /// The ring's batches live in a batch arena that lets `ahead_max` be bound ahead.
    pub(crate) fn in_arena(&mut self, ahead_max: usize) {
        self.layout.ahead_max = ahead_max;
    }

    /// The ring is the earlier epoch's, taken over.
    pub(crate) fn share_ring(&mut self) {
        self.shared_ring = true;
    }

    /// Buffers in the epoch's ring: with a batch arena, those bound ahead as well.
    pub(crate) fn ring_buffers(&self) -> usize {
        self.layout.ring_batches + self.layout.ahead_max
    }

    /// Batches the consumer may hold before the next waits (its wait the consumer's
    /// `RingExhausted`, as on every transport). With a batch arena the ring holds the
    /// batches bound ahead too, so its free buffers do not stop a consumer that keeps every
    /// batch: the consumer may hold `ring_batches` of this epoch's, [`SHARED_RING_GROWTH`]
    /// times that in a ring shared with the epoch before. `None`: the ring's own bound is
    /// the limit.
    pub(crate) fn hold_limit(&self) -> Option<usize> {
        let growth = if self.shared_ring {
            SHARED_RING_GROWTH
        } else {
            1
        };
        (self.layout.ahead_max > 0).then_some(self.layout.ring_batches * growth)
    }

    /// Whether and when the ring grows while a batch waits for one of its buffers.
    pub(crate) fn growth(&self) -> Growth {
        Growth {
            shared: self.shared_ring,
        }
    }

    /// The next thing to bind, if there is one: a batch ahead of the one being filled, as
    /// far ahead as samples have arrived early so far (`reached`, and one more), up to the
    /// arena's bound, within the epoch.
    pub(crate) fn bind_ahead(&self, reached: u64) -> Option<Step> {
        let most = self
            .layout
            .ahead_max
            .min(usize::try_from(reached.saturating_add(1)).unwrap_or(usize::MAX));
        let bound = self.ahead.len();
        let index = self.next + u64::from(self.filling.is_some()) + bound as u64;
        (bound < most && index < self.layout.batches).then_some(Step::BindAhead(index))
    }

    /// The batch being filled, if it is bound (taking it from those bound ahead when it is
    /// next); else the buffer to wait for.
    pub(crate) fn filling(&mut self) -> Result<&mut Bound, Step> {
        if self.filling.is_none() && self.ahead.front().is_some_and(|b| self.is(b, self.next)) {
            self.filling = self.ahead.pop_front();
        }
        let next = self.next;
        self.filling.as_mut().ok_or(Step::Reserve(next))
    }

    /// A ring buffer is bound to batch `bound` (as a [`Step`] asked).
    pub(crate) fn bound(&mut self, bound: Bound) {
        match self.filling.is_none() && self.is(&bound, self.next) {
            true => self.filling = Some(bound),
            false => self.ahead.push_back(bound),
        }
    }

    /// Whether binding batch `index` takes the buffer of the epoch's last batch (the next
    /// epoch, started early, may fill from the ring from then on).
    pub(crate) fn is_last(&self, index: u64) -> bool {
        index + 1 >= self.layout.batches
    }

    /// The batches bound now (the one being filled and those ahead), with the first place of
    /// each one that is in the batch arena.
    pub(crate) fn bound_batches(&self) -> Vec<(u64, u32)> {
        self.filling
            .iter()
            .chain(&self.ahead)
            .filter_map(|b| Some((b.filling.index(), b.first?)))
            .collect()
    }

    /// The batch being filled is full: it, and what it needs before the consumer gets it
    /// (`owned(places)`: whether a worker may still write any of them). The next batch is
    /// the one to fill from now.
    pub(crate) fn close(
        &mut self,
        batch_size: u32,
        owned: impl Fn(Range<u32>) -> bool,
    ) -> Option<(Bound, Settle)> {
        let bound = self.filling.take()?;
        debug_assert!(
            bound.filling.is_full(),
            "the protocol closed a batch before it was full"
        );
        self.next += 1;
        let settle = settle(bound.first, batch_size, owned);
        Some((bound, settle))
    }

    fn is(&self, bound: &Bound, index: u64) -> bool {
        bound.filling.index() == index
    }
}

/// Where the sample at position `at` of a batch lands. `first` is the batch's first place in
/// the arena (`None`: its buffer is not there), `written_at` the place the worker wrote the
/// tensor to (if it did), `owned(place)` whether a worker may still write that place.
pub(crate) fn landing(
    first: Option<u32>,
    at: usize,
    written_at: Option<u32>,
    owned: impl Fn(u32) -> bool,
) -> Landing {
    let Some(first) = first else {
        return Landing::Copy;
    };
    let place = first + at as u32;
    if written_at != Some(place) && owned(place) {
        Landing::Defer
    } else {
        Landing::Copy
    }
}

/// What batch of `batch_size` places from `first` needs when it closes (`owned(range)`:
/// whether a worker may still write any of them).
pub(crate) fn settle(
    first: Option<u32>,
    batch_size: u32,
    owned: impl Fn(Range<u32>) -> bool,
) -> Settle {
    match first {
        Some(first) if owned(first..first + batch_size) => Settle::Fresh,
        _ => Settle::InPlace,
    }
}

#[cfg(test)]
mod tests;
