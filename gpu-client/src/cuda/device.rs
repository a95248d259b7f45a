//! The device: its primary context, bound per thread, and page-locked host memory
//! (`cuMemHostAlloc`) that the GPU copies from by DMA.

use std::sync::Arc;

use cudarc::driver::{result, sys};

/// The CUDA bindings this module is built on, for callers that drive the device themselves
/// (benchmarks, the Python binding's stream handling).
pub use cudarc;

use super::{call, CudaError};
use crate::batch::{HostAllocator, HostMemory};

/// A device's primary context, bound to each thread that calls CUDA through it.
pub struct Gpu {
    pub(crate) ordinal: usize,
    pub(crate) dev: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
}

// A primary context is usable from any thread once made current there.
unsafe impl Send for Gpu {}

unsafe impl Sync for Gpu {}

impl Gpu {
    /// Opens device `ordinal`, or says why it cannot (no driver, no such device).
    pub fn open(ordinal: usize) -> Result<Arc<Gpu>, CudaError> {
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDriver);
        }
        let device = |detail: String| CudaError::Device { ordinal, detail };
        result::init().map_err(|e| device(e.to_string()))?;
        let count = result::device::get_count().map_err(|e| device(e.to_string()))?;
        if ordinal as i32 >= count {
            return Err(device(format!("this machine has {count} CUDA devices")));
        }
        let dev = result::device::get(ordinal as i32).map_err(|e| device(e.to_string()))?;
        // SAFETY: a valid device handle; released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(|e| device(e.to_string()))?;
        let gpu = Gpu { ordinal, dev, ctx };
        gpu.bind()?;
        Ok(Arc::new(gpu))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes the context current on this thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained until Drop.
        call("cuCtxSetCurrent", unsafe {
            result::ctx::set_current(self.ctx)
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// Page-locked host memory from `cuMemHostAlloc`: the GPU copies from it by DMA, at full
/// link speed, without a staging copy in the driver.
pub struct PinnedAllocator {
    pub(crate) gpu: Arc<Gpu>,
}

impl PinnedAllocator {
    pub fn new(gpu: Arc<Gpu>) -> Self {
        PinnedAllocator { gpu }
    }
}

pub(crate) struct Pinned {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// Plain host memory, owned by this value alone.
unsafe impl Send for Pinned {}

impl HostMemory for Pinned {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes allocated in `allocate`, freed only in Drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: allocated by cuMemHostAlloc in `allocate`.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Shared memory page-locked with `cuMemHostRegister` ([`HostAllocator::adopt`]): the
/// same-host batch arena, which the GPU then copies from by DMA as from `cuMemHostAlloc`
/// memory. Unregistered when dropped.
struct Registered {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
}

// The registration of a range this value alone undoes.
unsafe impl Send for Registered {}
unsafe impl Sync for Registered {}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() {
            // SAFETY: registered in `adopt`, still mapped (the arena drops this first).
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
        }
    }
}

impl HostAllocator for PinnedAllocator {
    fn adopt(&self, ptr: *mut u8, len: usize) -> Option<Result<crate::batch::Adopted, String>> {
        let registered = self.gpu.bind().map_err(|e| e.to_string()).and_then(|()| {
            // SAFETY: `len` mapped bytes at `ptr`, which stay mapped until the result drops.
            let r = unsafe {
                sys::cuMemHostRegister_v2(ptr.cast(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
            };
            r.result()
                .map_err(|e| format!("cuMemHostRegister of {len} bytes of shared memory: {e}"))
        });
        Some(registered.map(|()| {
            Box::new(Registered {
                gpu: self.gpu.clone(),
                ptr,
            }) as crate::batch::Adopted
        }))
    }

    fn allocate(&self, bytes: usize) -> Result<Box<dyn HostMemory>, String> {
        self.gpu.bind().map_err(|e| e.to_string())?;
        // SAFETY: a fresh allocation of `bytes`, zeroed below before any read.
        let ptr = unsafe { result::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| format!("cuMemHostAlloc of {bytes} bytes: {e}"))?;
        let mut m = Pinned {
            gpu: self.gpu.clone(),
            ptr: ptr.cast(),
            len: bytes,
        };
        m.as_mut_slice().fill(0);
        Ok(Box::new(m))
    }
}
