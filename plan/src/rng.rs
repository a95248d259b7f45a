//! Seeded random streams for planning and augmentation.
//!
//! Every random choice Sluice makes comes from a ChaCha8 stream keyed by the job seed and the
//! coordinates of the choice (a domain tag, the epoch, a rank or sample id), so every rank,
//! worker and thread derives the same value with no coordination. Fisher-Yates and bounded
//! draws are written here rather than taken from `rand`, whose algorithms may change between
//! versions: a plan must not change because a dependency was upgraded.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Domain tags, so two uses of the same coordinates never share a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Domain {
    ShardOrder = 1,
    Remainder = 2,
    UnitOrder = 3,
    PartialTake = 4,
    PartialRing = 5,
    ShuffleBuffer = 6,
    Sample = 7,
    Interleave = 8,
    MixBuffer = 9,
    ShardWrite = 10,
    Resume = 11,
    MixPass = 12,
    MixUnits = 13,
    MixInterleave = 14,
    MixGroupBuffer = 15,
    /// A sample's random pixel ops, from a seed its own stream draws (so every frame of a
    /// clip draws the same).
    PixelOps = 16,
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The random stream for `(seed, domain, a, b)`.
pub fn stream(seed: u64, domain: Domain, a: u64, b: u64) -> Stream {
    let mut state = splitmix64(seed);
    for x in [domain as u64, a, b] {
        state = splitmix64(state ^ x);
    }
    let mut key = [0u8; 32];
    for chunk in key.chunks_exact_mut(8) {
        state = splitmix64(state);
        chunk.copy_from_slice(&state.to_le_bytes());
    }
    Stream(ChaCha8Rng::from_seed(key))
}

/// The seed of one sample's augmentation: a function of (job seed, epoch, shard, index in the
/// shard) only, so the sample's output is byte-identical whichever worker or thread makes it.
pub fn sample_seed(seed: u64, epoch: u64, shard: u32, index: u64) -> u64 {
    sample_stream(seed, epoch, shard, index).next_u64()
}

/// The random stream of one sample's augmentation (see [`sample_seed`]).
pub fn sample_stream(seed: u64, epoch: u64, shard: u32, index: u64) -> Stream {
    stream(
        seed,
        Domain::Sample,
        epoch,
        (u64::from(shard) << 32) ^ index,
    )
}

/// A seeded random stream.
#[derive(Clone, Debug)]
pub struct Stream(ChaCha8Rng);

impl Stream {
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform draw from `0..n` (Lemire's method with rejection; `n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Shuffles in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_fixed_functions_of_their_coordinates() {
        let a: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(stream(42, Domain::ShardOrder, 3, 0), |s, _| {
                Some(s.next_u64())
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map(|_| 0)
            .scan(stream(42, Domain::ShardOrder, 3, 0), |s, _| {
                Some(s.next_u64())
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(
            stream(42, Domain::ShardOrder, 3, 0).next_u64(),
            stream(42, Domain::ShardOrder, 4, 0).next_u64()
        );
        assert_ne!(
            stream(42, Domain::ShardOrder, 3, 0).next_u64(),
            stream(42, Domain::UnitOrder, 3, 0).next_u64()
        );
        assert_eq!(sample_seed(1, 2, 3, 4), sample_seed(1, 2, 3, 4));
        assert_ne!(sample_seed(1, 2, 3, 4), sample_seed(1, 2, 3, 5));
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut s = stream(7, Domain::Sample, 0, 0);
        let mut counts = [0u32; 6];
        for _ in 0..60_000 {
            counts[s.below(6) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }
}
