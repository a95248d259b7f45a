//! A sample's bytes between its arrival and its batch: QUIC payloads read off the stream, and
//! same-host samples copied out of their slot to wait for their turn when their segment has
//! no spare slot left, in buffers the
//! loader reuses across epochs ([`BufferPool`]; without it, the page faults of a fresh
//! 150 KB `Vec` per sample were most of the client's time on the same-host probe).

use std::sync::{Arc, Weak};

use sluice_wire::BufferPool;

/// Takes a buffer of `len` bytes from `pool`, returned to it when dropped.
pub(crate) fn take(pool: &Arc<BufferPool>, len: usize) -> TensorBuf {
    TensorBuf {
        bytes: pool.take(len),
        len,
        home: Arc::downgrade(pool),
    }
}

/// A sample's bytes: from the loader's pool, or any `Vec` handed over (an in-process
/// worker's output).
pub(crate) struct TensorBuf {
    bytes: Vec<u8>,
    /// The bytes in use (the tensor after `truncate`); the rest stays for reuse.
    len: usize,
    home: Weak<BufferPool>,
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
    fn a_buffer_returns_whole_to_its_pool() {
        let pool = Arc::new(BufferPool::new(4));
        let mut a = take(&pool, 8);
        a.copy_from_slice(&[7; 8]);
        a.truncate(3);
        assert_eq!(&a[..], [7, 7, 7]);
        drop(a);
        assert_eq!(pool.spares(8), 1, "back at its full length");
        let handed: TensorBuf = vec![1, 2].into();
        assert_eq!(&handed[..], [1, 2]);
        drop(handed);
        assert_eq!(pool.spares(2), 0, "a handed-over Vec has no pool");
    }
}
