//! The copy of a tensor into a batch: the one copy a client makes of each sample, on its hot
//! path.
//!
//! A batch is written once and then read by someone else: the GPU's DMA engine, or the
//! consumer much later, after the batch and several others have gone through this core's
//! cache. A plain `memcpy` of a large tensor still reads each destination line into the cache
//! first (read-for-ownership) and evicts the source, which the worker has just written and
//! which is often still in the shared cache. Non-temporal (streaming) stores write the
//! destination straight to memory instead. On this project's 2-core VM, a 150 KB tensor that
//! another core has just written copies in about 10 µs that way against 16 µs with `memcpy`
//! (a microbenchmark), and `sluice bench host-cost` over same-host dropped by about 8%. From a
//! source long out of every cache it can be a little slower (12–13 against 14 µs there), which
//! is why that benchmark's floor takes the cheaper of the two.
//!
//! Small tensors (under [`STREAMING_FROM`]) are copied plainly: they fit the cache, where the
//! consumer may well read them soon. So are QUIC packets (see [`Streaming`]).

/// Tensors of at least this many bytes are worth streaming stores ([`Streaming`]).
pub const STREAMING_FROM: usize = 16 << 10;

/// Copies a tensor of `dst.len()` bytes into a batch: with streaming stores from
/// [`STREAMING_FROM`] bytes on, plainly below.
///
/// # Panics
/// If the lengths differ, as `copy_from_slice` does.
pub fn copy_tensor(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a tensor copy: lengths differ");
    // SAFETY: both are valid for `len` bytes, and a `&mut` and a `&` cannot overlap.
    unsafe { copy_tensor_raw(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
}

/// [`copy_tensor`] from memory that another process may write (a shared-memory slot), which
/// Rust must not see as a `&[u8]`.
///
/// # Safety
/// `src` must be valid for reads of `len` bytes and `dst` for writes of `len` bytes, and the
/// two must not overlap.
pub unsafe fn copy_tensor_raw(dst: *mut u8, src: *const u8, len: usize) {
    if len >= STREAMING_FROM {
        // SAFETY: the caller's contract.
        unsafe { Streaming::new().copy_raw(dst, src, len) }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// Streaming copies (x86-64: SSE2 `movntdq`, which every x86-64 processor has; a plain copy
/// elsewhere), for one tensor in one or several pieces. Dropping it fences the stores, so the
/// bytes are visible before whatever the caller does next (a DMA, handing the batch to
/// another thread).
///
/// Not for QUIC packets: their ends fall mid-line, and a plain copy measured as cheap or
/// cheaper there.
pub struct Streaming(());

impl Streaming {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        Streaming(())
    }

    /// Copies `src` into `dst`.
    ///
    /// # Panics
    /// If the lengths differ, as `copy_from_slice` does.
    pub fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "a streaming copy: lengths differ");
        // SAFETY: both are valid for `len` bytes, and a `&mut` and a `&` cannot overlap.
        unsafe { self.copy_raw(dst.as_mut_ptr(), src.as_ptr(), dst.len()) }
    }

    /// [`Streaming::copy`] from memory that another process may write (a shared-memory
    /// slot), which Rust must not see as a `&[u8]`.
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes and `dst` for writes of `len` bytes, and
    /// the two must not overlap.
    pub unsafe fn copy_raw(&mut self, dst: *mut u8, src: *const u8, len: usize) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the caller's contract.
        unsafe {
            stream_sse2(dst, src, len)
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: the caller's contract.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, len)
        }
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a store fence has no preconditions (SSE2 is part of x86-64).
        unsafe {
            std::arch::x86_64::_mm_sfence()
        }
    }
}

/// A plain head up to 16-byte alignment of `dst`, 64 bytes a step with `movntdq`, a plain
/// tail; the caller fences ([`Streaming`]'s drop).
#[cfg(target_arch = "x86_64")]
unsafe fn stream_sse2(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    const STEP: usize = 64;
    // SAFETY (whole body): every access is within `0..len` of both pointers (the caller's
    // contract); the streaming stores go to 16-byte aligned addresses, as `movntdq` requires.
    unsafe {
        let head = dst.align_offset(16).min(len);
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut at = head;
        while at + STEP <= len {
            let s = src.add(at).cast::<__m128i>();
            let d = dst.add(at).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            at += STEP;
        }
        std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_length_and_alignment_copies_exactly() {
        let src: Vec<u8> = (0..STREAMING_FROM * 3 + 77)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let lens = [
            0,
            1,
            15,
            63,
            64,
            65,
            STREAMING_FROM - 1,
            STREAMING_FROM,
            STREAMING_FROM * 3,
        ];
        for len in lens {
            for dst_off in [0, 1, 7, 15] {
                for src_off in [0, 3] {
                    let mut dst = vec![0xeeu8; len + dst_off + 16];
                    copy_tensor(
                        &mut dst[dst_off..dst_off + len],
                        &src[src_off..src_off + len],
                    );
                    let mut pieces = vec![0xeeu8; len];
                    let mut s = Streaming::new();
                    for (d, c) in pieces.chunks_mut(1000).zip(src[src_off..].chunks(1000)) {
                        s.copy(d, &c[..d.len()]);
                    }
                    drop(s);
                    assert_eq!(&pieces[..], &src[src_off..src_off + len], "in pieces");
                    assert_eq!(&dst[dst_off..dst_off + len], &src[src_off..src_off + len]);
                    assert!(
                        dst[..dst_off].iter().all(|&b| b == 0xee),
                        "before, len {len}"
                    );
                    assert!(
                        dst[dst_off + len..].iter().all(|&b| b == 0xee),
                        "after, len {len}"
                    );
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn different_lengths_are_refused() {
        Streaming::new().copy(&mut [0u8; 4], &[1u8; 5]);
    }
}
