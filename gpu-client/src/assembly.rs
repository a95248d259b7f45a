//! Batch assembly as pure decisions: how many ring buffers an epoch has, which batches are
//! bound to buffers ahead of the one being filled, whether a sample lands in place, is
//! copied, or waits because a worker may still write its place, and whether a closed batch
//! can be handed out in its own buffer. The coordinator (`crate::coordinator`) awaits
//! buffers and copies as these say; the arena (`crate::arena`) keeps who owns each place.
//!
//! The arena's rules these serve (ARCHITECTURE.md, *No shared writer*): the client never
//! writes a place a worker owns, and never hands out a batch with one; such a batch is copied
//! into a fresh buffer and its arena buffer retired until its places are settled.

/// How an epoch assembles its batches.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Assembly {
    /// Batches in the epoch.
    pub batches: u64,
    /// Batches the consumer may hold (the ring's size without an arena).
    pub ring_batches: usize,
    /// Batches the batch arena lets be bound ahead of the one being filled; 0 without an
    /// arena.
    pub ahead_max: usize,
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

impl Assembly {
    /// Buffers in the epoch's ring: with a batch arena, those bound ahead as well.
    pub(crate) fn ring_buffers(&self) -> usize {
        self.ring_batches + self.ahead_max
    }

    /// With a batch arena the ring holds the batches bound ahead too, so its free buffers do
    /// not stop a consumer that keeps every batch: the consumer may hold `ring_batches` of
    /// this epoch's (twice that in a ring shared with the epoch before, which may grow to
    /// twice its size), and the next batch waits, its wait the consumer's `RingExhausted` as
    /// on every transport. `None`: the ring's own bound is the limit.
    pub(crate) fn hold_limit(&self, shared_ring: bool) -> Option<usize> {
        (self.ahead_max > 0).then(|| self.ring_batches * if shared_ring { 2 } else { 1 })
    }

    /// The next batch to bind a free buffer to ahead of the one being filled, if one should
    /// be: as far ahead as samples have arrived early so far (`reached`, and one more), up to
    /// the arena's bound, within the epoch. `next` is the batch to fill next, `filling`
    /// whether it is bound already, `bound_ahead` how many after it are.
    pub(crate) fn bind_next(
        &self,
        next: u64,
        filling: bool,
        bound_ahead: usize,
        reached: u64,
    ) -> Option<u64> {
        let most = self
            .ahead_max
            .min(usize::try_from(reached.saturating_add(1)).unwrap_or(usize::MAX));
        let index = next + u64::from(filling) + bound_ahead as u64;
        (bound_ahead < most && index < self.batches).then_some(index)
    }

    /// Whether binding batch `index` takes the buffer of the epoch's last batch (the next
    /// epoch, started early, may fill from the ring from then on).
    pub(crate) fn is_last(&self, index: u64) -> bool {
        index + 1 >= self.batches
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
    owned: impl Fn(std::ops::Range<u32>) -> bool,
) -> Settle {
    match first {
        Some(first) if owned(first..first + batch_size) => Settle::Fresh,
        _ => Settle::InPlace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assembly(ahead_max: usize) -> Assembly {
        Assembly {
            batches: 10,
            ring_batches: 3,
            ahead_max,
        }
    }

    #[test]
    fn batches_are_bound_ahead_only_as_far_as_samples_arrive_early() {
        let a = assembly(4);
        assert_eq!(a.ring_buffers(), 7);
        // Nothing early yet: one ahead of the batch being filled.
        assert_eq!(a.bind_next(0, true, 0, 0), Some(1));
        assert_eq!(a.bind_next(0, true, 1, 0), None);
        // Samples reached two batches on: up to three ahead, never past the arena's bound
        // or the epoch's end.
        assert_eq!(a.bind_next(0, true, 2, 2), Some(3));
        assert_eq!(a.bind_next(0, true, 3, 2), None);
        assert_eq!(a.bind_next(0, false, 3, 100), Some(3));
        assert_eq!(a.bind_next(0, false, 4, 100), None);
        assert_eq!(a.bind_next(8, true, 0, 100), Some(9));
        assert_eq!(a.bind_next(8, true, 1, 100), None);
        assert!(a.is_last(9) && !a.is_last(8));
        // No arena: nothing is bound ahead, and the ring alone bounds the consumer.
        let plain = assembly(0);
        assert_eq!(plain.bind_next(0, true, 0, 100), None);
        assert_eq!(plain.hold_limit(false), None);
        assert_eq!(a.hold_limit(false), Some(3));
        assert_eq!(a.hold_limit(true), Some(6));
    }

    #[test]
    fn a_sample_waits_only_where_a_worker_may_still_write_its_place() {
        let owned = |p: u32| p == 12;
        assert_eq!(landing(None, 2, None, owned), Landing::Copy);
        assert_eq!(landing(Some(10), 2, Some(12), owned), Landing::Copy);
        assert_eq!(landing(Some(10), 2, None, owned), Landing::Defer);
        assert_eq!(landing(Some(10), 2, Some(40), owned), Landing::Defer);
        assert_eq!(landing(Some(10), 3, None, owned), Landing::Copy);
        let owned_range = |r: std::ops::Range<u32>| r.contains(&12);
        assert_eq!(settle(Some(10), 4, owned_range), Settle::Fresh);
        assert_eq!(settle(Some(20), 4, owned_range), Settle::InPlace);
        assert_eq!(settle(None, 4, owned_range), Settle::InPlace);
    }
}
