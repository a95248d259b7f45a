//! The shuffle buffer: a bounded pool that mixes samples from the several work units a rank
//! reads at once, the in-memory half of Sluice's randomness (the plan's shard and unit order
//! is the other half).
//!
//! Once full, every insertion hands back a uniformly chosen resident, the way WebDataset and
//! tf.data shuffle streams. Its choices are seeded, so for a given input order its output
//! order is reproducible. The plan's order ([`crate::order`]) runs it over the interleaved
//! plan (a pure function); the client's arrival-order mode runs it over arrivals (mixed, but
//! not reproducible); `sluice shard` runs it over a tar stream it cannot hold whole.

use crate::rng::{stream, Domain, Stream};

/// A bounded, seeded shuffle buffer.
#[derive(Debug)]
pub struct ShuffleBuffer<T> {
    items: Vec<T>,
    capacity: usize,
    rng: Stream,
}

impl<T> ShuffleBuffer<T> {
    /// A buffer holding at most `capacity` items (at least 1).
    pub fn new(capacity: usize, seed: u64, epoch: u64, rank: u32) -> Self {
        let capacity = capacity.max(1);
        ShuffleBuffer {
            items: Vec::with_capacity(capacity),
            capacity,
            rng: stream(seed, Domain::ShuffleBuffer, epoch, u64::from(rank)),
        }
    }

    /// A buffer of at most `capacity` items (at least 1) drawing from `rng`.
    pub fn from_stream(capacity: usize, rng: Stream) -> Self {
        let capacity = capacity.max(1);
        ShuffleBuffer {
            items: Vec::with_capacity(capacity.min(1 << 16)),
            capacity,
            rng,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.items.len() >= self.capacity
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds an item. When the buffer was full, a uniformly chosen item (possibly this one)
    /// comes back, so the buffer never holds more than its capacity.
    pub fn push(&mut self, item: T) -> Option<T> {
        if !self.is_full() {
            self.items.push(item);
            return None;
        }
        let i = self.rng.below(self.items.len() as u64 + 1) as usize;
        if i == self.items.len() {
            Some(item)
        } else {
            Some(std::mem::replace(&mut self.items[i], item))
        }
    }

    /// Takes a uniformly chosen item: drains the buffer at the end of the input.
    pub fn pop(&mut self) -> Option<T> {
        if self.items.is_empty() {
            return None;
        }
        let i = self.rng.below(self.items.len() as u64) as usize;
        Some(self.items.swap_remove(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_item_comes_out_once_and_the_bound_holds(n in 0usize..2000, cap in 1usize..300, seed in any::<u64>()) {
            let mut buf = ShuffleBuffer::new(cap, seed, 0, 0);
            let mut out = Vec::new();
            for i in 0..n {
                out.extend(buf.push(i));
                prop_assert!(buf.len() <= cap);
            }
            while let Some(x) = buf.pop() {
                out.push(x);
            }
            let mut sorted = out.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..n).collect::<Vec<_>>());
        }
    }

    #[test]
    fn mixes_and_is_reproducible() {
        let run = |seed| {
            let mut buf = ShuffleBuffer::new(100, seed, 1, 2);
            let mut out: Vec<u32> = (0..1000).filter_map(|i| buf.push(i)).collect();
            out.extend(std::iter::from_fn(|| buf.pop()));
            out
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
        let displaced = run(5)
            .iter()
            .enumerate()
            .filter(|(i, &v)| *i as u32 != v)
            .count();
        assert!(displaced > 900, "{displaced}");
    }
}
