//! Reused tensor buffers for samples between their arrival and their batch: QUIC payloads
//! read off the stream, and same-host samples copied out of their slot while they wait for
//! their turn.
//!
//! A tensor of 224×224×3 is 150 KB, above glibc's mmap threshold: a fresh `Vec` per sample
//! is an `mmap`, a page fault and a zeroed page per 4 KB touched, and an `munmap` when the
//! batch has taken it. Measured on the same-host probe, that churn was most of the client's
//! time. Buffers of one size go back to the loader's spares instead and are written again.

use std::sync::{Arc, Mutex, Weak};

/// The spare buffers of one loader, of any one size at a time (the job's payload size).
pub(crate) struct TensorBuffers {
    spares: Mutex<Vec<Vec<u8>>>,
    /// At most this many are kept: about what the client may hold at once.
    keep: usize,
}

impl TensorBuffers {
    pub(crate) fn new(keep: usize) -> Arc<Self> {
        Arc::new(TensorBuffers {
            spares: Mutex::new(Vec::new()),
            keep,
        })
    }

    /// A buffer of `len` bytes: a spare of that length (its old contents, to be overwritten
    /// whole by the caller), or a fresh zeroed one.
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> TensorBuf {
        let spare = self.spares.lock().ok().and_then(|mut s| match s.last() {
            Some(b) if b.len() == len => s.pop(),
            _ => None,
        });
        TensorBuf {
            len,
            bytes: spare.unwrap_or_else(|| vec![0u8; len]),
            home: Arc::downgrade(self),
        }
    }

    fn give_back(&self, bytes: Vec<u8>) {
        if let Ok(mut s) = self.spares.lock() {
            // A different size means the job changed: the old spares are of no more use.
            if s.first().is_some_and(|b| b.len() != bytes.len()) {
                s.clear();
            }
            if s.len() < self.keep {
                s.push(bytes);
            }
        }
    }

    #[cfg(test)]
    fn spares(&self) -> usize {
        self.spares.lock().map(|s| s.len()).unwrap_or(0)
    }
}

/// A sample's bytes: from the spares (returned when dropped), or any `Vec` handed over (an
/// in-process worker's output).
pub(crate) struct TensorBuf {
    bytes: Vec<u8>,
    /// The bytes in use (the tensor after `truncate`); the rest stays for reuse.
    len: usize,
    home: Weak<TensorBuffers>,
}

impl TensorBuf {
    /// Keeps the first `len` bytes (the tensor without its fields).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl From<Vec<u8>> for TensorBuf {
    fn from(bytes: Vec<u8>) -> Self {
        TensorBuf {
            len: bytes.len(),
            bytes,
            home: Weak::new(),
        }
    }
}

impl std::ops::Deref for TensorBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::ops::DerefMut for TensorBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

impl Drop for TensorBuf {
    fn drop(&mut self) {
        if let Some(home) = self.home.upgrade() {
            home.give_back(std::mem::take(&mut self.bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_by_size_and_kept_up_to_a_bound() {
        let pool = TensorBuffers::new(2);
        let mut a = pool.take(8);
        a.copy_from_slice(&[7; 8]);
        let address = a.as_ptr();
        drop(a);
        assert_eq!(pool.spares(), 1);
        let mut b = pool.take(8);
        assert_eq!(b.as_ptr(), address, "the spare is written again");
        b.truncate(3);
        assert_eq!(&b[..], [7, 7, 7]);
        drop(b);
        let c = pool.take(5);
        assert_eq!(&c[..], [0; 5], "another size is a fresh buffer");
        drop(c);
        assert_eq!(pool.spares(), 1, "the 8-byte spare gave way to the new size");
        let (x, y, z) = (pool.take(5), pool.take(5), pool.take(5));
        drop((x, y, z));
        assert_eq!(pool.spares(), 2, "no more than keep");
        let handed: TensorBuf = vec![1, 2].into();
        assert_eq!(&handed[..], [1, 2]);
    }
}
