//! Reused tensor buffers: what a sample's tensor is written into on its way between the
//! decoder and the batch, on both sides of the wire.
//!
//! A tensor of 224×224×3 is 150 KB, above glibc's mmap threshold: a fresh `Vec` per sample
//! costs an `mmap`, a page fault and a zeroed page per 4 KB touched, and an `munmap` (or a
//! heap trim) when it is dropped. The engine's output and the client's waiting samples go
//! back to a pool instead and are written again.

use std::sync::Mutex;

/// Sizes a pool keeps spares of (a job's tensor, and its layout before conversion); the
/// oldest size gives way to a new one.
const SIZES: usize = 4;

/// Spare buffers by length.
pub struct BufferPool {
    stacks: Mutex<Vec<(usize, Vec<Vec<u8>>)>>,
    /// At most this many spares of each length.
    keep: usize,
}

impl BufferPool {
    pub fn new(keep: usize) -> Self {
        BufferPool {
            stacks: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A buffer of `len` bytes: a spare of that length with its old contents (the caller
    /// overwrites all of it), or a fresh zeroed one.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let spare = self.stacks.lock().ok().and_then(|mut s| {
            s.iter_mut()
                .find(|(l, _)| *l == len)
                .and_then(|(_, stack)| stack.pop())
        });
        spare.unwrap_or_else(|| vec![0u8; len])
    }

    /// Keeps `buf` for a later [`BufferPool::take`] of its length (or drops it when the pool
    /// has enough of them).
    pub fn give_back(&self, buf: Vec<u8>) {
        let Ok(mut s) = self.stacks.lock() else {
            return;
        };
        let len = buf.len();
        if len == 0 {
            return;
        }
        let at = match s.iter().position(|(l, _)| *l == len) {
            Some(at) => at,
            None => {
                if s.len() == SIZES {
                    s.remove(0);
                }
                s.push((len, Vec::new()));
                s.len() - 1
            }
        };
        if s[at].1.len() < self.keep {
            s[at].1.push(buf);
        }
    }

    /// Spares of `len` bytes held now.
    pub fn spares(&self, len: usize) -> usize {
        self.stacks
            .lock()
            .ok()
            .and_then(|s| s.iter().find(|(l, _)| *l == len).map(|(_, v)| v.len()))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_length_and_kept_up_to_a_bound() {
        let pool = BufferPool::new(2);
        let mut a = pool.take(8);
        a.copy_from_slice(&[7; 8]);
        let address = a.as_ptr();
        pool.give_back(a);
        assert_eq!(pool.spares(8), 1);
        let b = pool.take(8);
        assert_eq!(b.as_ptr(), address, "the spare is written again");
        assert_eq!(b, [7; 8], "with its old contents");
        assert_eq!(pool.take(5), [0; 5], "another length is a fresh buffer");
        pool.give_back(b);
        for _ in 0..3 {
            pool.give_back(vec![1; 5]);
        }
        assert_eq!(
            (pool.spares(8), pool.spares(5)),
            (1, 2),
            "no more than keep"
        );
        for len in 1..=SIZES {
            pool.give_back(vec![0; 100 + len]);
        }
        assert_eq!(pool.spares(8), 0, "the oldest length gave way");
    }
}
