//! The CUDA upload path (feature `cuda`): page-locked batch buffers, and an uploader that
//! copies each host batch to a reused device buffer on its own stream while the previous
//! step computes, optionally converting uint8 NHWC to normalized f16/f32 NCHW on the device.
//!
//! CUDA is loaded at run time (cudarc's dynamic loading): the crate builds and its tests run
//! on machines without a driver, and [`Gpu::open`] says clearly when there is none.
//!
//! Synchronisation, per device buffer:
//! - the copy (and conversion) is enqueued on the uploader's stream after it waits on the
//!   buffer's `released` event, then the buffer's `ready` event is recorded;
//! - the consumer makes its stream wait on `ready` ([`DeviceBatch::wait_on`]) before using the
//!   data; dropping the batch orders the buffer's refill after the work queued on every stream
//!   that waited on it (through `released`), so the consumer's work always sees its data;
//! - the host batch's ring buffer goes back to the ring from a host function enqueued on the
//!   copy stream after the copy, so the ring never reuses memory a copy still reads, yet
//!   refills while the consumer holds the device batch; labels are staged in the slot's own
//!   page-locked buffer (a copy from pageable memory would synchronize the copy stream).

use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{result, sys};

/// The CUDA bindings this module is built on, for callers that drive the device themselves
/// (benchmarks, the Python binding's stream handling).
pub use cudarc;

use crate::batch::{Batch, HostAllocator, HostMemory};
use crate::error::ClientError;
use crate::loader::Epoch;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CudaError {
    #[error("no NVIDIA driver: libcuda could not be loaded on this machine")]
    NoDriver,
    #[error("CUDA device {ordinal}: {detail}")]
    Device { ordinal: usize, detail: String },
    #[error("CUDA {what}: {detail}")]
    Call { what: &'static str, detail: String },
    #[error("NVRTC (for the on-device conversion): {0}")]
    Nvrtc(String),
}

fn call<T>(what: &'static str, r: Result<T, result::DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Call {
        what,
        detail: e.to_string(),
    })
}

/// A device's primary context, bound to each thread that calls CUDA through it.
pub struct Gpu {
    ordinal: usize,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
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
    gpu: Arc<Gpu>,
}

impl PinnedAllocator {
    pub fn new(gpu: Arc<Gpu>) -> Self {
        PinnedAllocator { gpu }
    }
}

struct Pinned {
    gpu: Arc<Gpu>,
    ptr: *mut u8,
    len: usize,
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

impl HostAllocator for PinnedAllocator {
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

/// What the uploader hands the training code: raw uint8 as the workers made it, or converted
/// on the device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Convert {
    /// The batch as it is (uint8, the pipeline's layout).
    None,
    /// `(x / 255 - mean[c]) / std[c]` as f32, NCHW.
    F32 { mean: [f32; 3], std: [f32; 3] },
    /// The same as f16, NCHW.
    F16 { mean: [f32; 3], std: [f32; 3] },
}

impl Convert {
    /// ImageNet's per-channel mean and std (of x / 255), what pretrained models expect.
    pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

    /// The conversion to the element type `dtype` names as numpy and torch spell it (`uint8`,
    /// `float16`, `float32`), or `None` for another name.
    pub fn to_dtype(dtype: &str, mean: [f32; 3], std: [f32; 3]) -> Option<Convert> {
        match dtype {
            "uint8" => Some(Convert::None),
            "float16" => Some(Convert::F16 { mean, std }),
            "float32" => Some(Convert::F32 { mean, std }),
            _ => None,
        }
    }
}

/// Element type of a device batch's images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    U8,
    F16,
    F32,
}

impl DType {
    pub fn bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

/// One thread per pixel of one image (`blockIdx.y`): it reads the pixel's channels and writes
/// one value to each channel plane, `x * scale[c] + bias[c]` (scale = 1 / (255 std),
/// bias = -mean / std). 32-bit arithmetic within an image, no division in the loop.
const KERNEL: &str = r#"
extern "C" __global__ void nhwc_u8_to_nchw(
    const unsigned char* src, void* dst, int hw, int c, int half,
    float k0, float k1, float k2, float b0, float b1, float b2)
{
    long long image = blockIdx.y;
    const unsigned char* in = src + image * hw * c;
    long long plane0 = image * c * (long long)hw;
    for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < hw; p += blockDim.x * gridDim.x) {
        for (int ch = 0; ch < c; ++ch) {
            float k = ch == 0 ? k0 : (ch == 1 ? k1 : k2);
            float bias = ch == 0 ? b0 : (ch == 1 ? b1 : b2);
            float v = fmaf((float)in[p * c + ch], k, bias);
            long long o = plane0 + (long long)ch * hw + p;
            if (half) {
                unsigned short bits;
                asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(v));
                ((unsigned short*)dst)[o] = bits;
            } else {
                ((float*)dst)[o] = v;
            }
        }
    }
}
"#;

struct Kernel {
    module: sys::CUmodule,
    function: sys::CUfunction,
}

impl Kernel {
    /// Compiles the conversion kernel with NVRTC (once, at start-up).
    fn compile() -> Result<Kernel, CudaError> {
        let image =
            crate::nvrtc::compile_ptx(KERNEL, "sluice_convert.cu").map_err(CudaError::Nvrtc)?;
        // SAFETY: a NUL-terminated PTX image; the module lives as long as `Kernel`.
        let module = call("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr().cast())
        })?;
        let name = CString::new("nhwc_u8_to_nchw").map_err(|e| CudaError::Nvrtc(e.to_string()))?;
        // SAFETY: the module was loaded above.
        let function = call("cuModuleGetFunction", unsafe {
            result::module::get_function(module, name)
        })?;
        Ok(Kernel { module, function })
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: loaded in `compile`, unloaded once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// One reusable set of device buffers.
struct Slot {
    images: sys::CUdeviceptr,
    images_bytes: usize,
    /// The converted images, when converting.
    converted: Option<(sys::CUdeviceptr, usize)>,
    labels: sys::CUdeviceptr,
    labels_bytes: usize,
    /// Page-locked staging for the labels (`labels_bytes`).
    labels_host: *mut u8,
    ready: sys::CUevent,
    released: sys::CUevent,
    /// Recorded after the host function that returns the ring buffer: once it completes, that
    /// function has run, so the batch's last hold on its ring is never dropped on a driver
    /// thread (freeing page-locked memory there would be a CUDA call).
    returned: sys::CUevent,
    /// Recorded just before the copy, when the uploader times its copies.
    started: Option<sys::CUevent>,
    /// A batch handed out holds this slot.
    busy: Arc<AtomicBool>,
    /// `released` has been recorded at least once (else there is nothing to wait for).
    used: Arc<AtomicBool>,
}

struct Shared {
    gpu: Arc<Gpu>,
    stream: sys::CUstream,
    slots: Mutex<Vec<Slot>>,
    kernel: Option<Kernel>,
    convert: Convert,
    /// Whether copies are bracketed by timing events (`Uploader::timed`).
    timed: bool,
    timing: CopyTiming,
}

/// What the timed copies added up to.
#[derive(Default)]
struct CopyTiming {
    bytes: AtomicU64,
    nanos: AtomicU64,
    batches: AtomicU64,
}

/// Bytes copied host to device and the GPU time the copies took, as CUDA events measured it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CopyStats {
    pub batches: u64,
    pub bytes: u64,
    pub seconds: f64,
}

impl CopyStats {
    /// Host-to-device bytes per second while copying.
    pub fn bytes_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds
        } else {
            0.0
        }
    }
}

// CUDA handles, used with the context bound and under the slots' mutex.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.gpu.bind().is_err() {
            return;
        }
        // SAFETY: everything below was created by this uploader and is freed once, after the
        // stream has finished with it.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            if let Ok(slots) = self.slots.get_mut() {
                for s in slots.drain(..) {
                    let _ = result::free_sync(s.images);
                    let _ = result::free_sync(s.labels);
                    let _ = result::free_host(s.labels_host.cast());
                    if let Some((p, _)) = s.converted {
                        let _ = result::free_sync(p);
                    }
                    let _ = result::event::destroy(s.ready);
                    let _ = result::event::destroy(s.released);
                    let _ = result::event::destroy(s.returned);
                    if let Some(e) = s.started {
                        let _ = result::event::destroy(e);
                    }
                }
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}

/// Copies host batches to device buffers on its own stream, `depth` batches ahead of the
/// consumer.
pub struct Uploader {
    shared: Arc<Shared>,
    depth: usize,
}

impl Uploader {
    /// An uploader on `gpu`; with a conversion, its kernel is compiled now (NVRTC).
    pub fn new(gpu: Arc<Gpu>, convert: Convert, depth: usize) -> Result<Uploader, CudaError> {
        Uploader::build(gpu, convert, depth, false)
    }

    /// An uploader that times every copy (and conversion) with CUDA events, for
    /// [`Uploader::copy_stats`]. Timing events cost a little; use it to measure.
    pub fn timed(gpu: Arc<Gpu>, convert: Convert, depth: usize) -> Result<Uploader, CudaError> {
        Uploader::build(gpu, convert, depth, true)
    }

    fn build(
        gpu: Arc<Gpu>,
        convert: Convert,
        depth: usize,
        timed: bool,
    ) -> Result<Uploader, CudaError> {
        gpu.bind()?;
        let kernel = match convert {
            Convert::None => None,
            _ => Some(Kernel::compile()?),
        };
        let stream = call(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(Uploader {
            shared: Arc::new(Shared {
                gpu,
                stream,
                slots: Mutex::new(Vec::new()),
                kernel,
                convert,
                timed,
                timing: CopyTiming::default(),
            }),
            depth: depth.max(1),
        })
    }

    /// What the timed copies of batches dropped so far added up to (zero unless `timed`).
    pub fn copy_stats(&self) -> CopyStats {
        let t = &self.shared.timing;
        CopyStats {
            batches: t.batches.load(Ordering::Relaxed),
            bytes: t.bytes.load(Ordering::Relaxed),
            seconds: t.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    /// The copy stream (for a consumer that would rather wait on it than on events).
    pub fn stream(&self) -> sys::CUstream {
        self.shared.stream
    }

    /// The epoch's batches on the device.
    pub fn epoch(&self, host: Epoch) -> DeviceEpoch {
        DeviceEpoch {
            host,
            shared: self.shared.clone(),
            depth: self.depth,
            inflight: VecDeque::new(),
        }
    }
}

impl Shared {
    fn out_dtype(&self) -> DType {
        match self.convert {
            Convert::None => DType::U8,
            Convert::F16 { .. } => DType::F16,
            Convert::F32 { .. } => DType::F32,
        }
    }

    /// A free slot large enough for `batch`, growing the pool when every slot is busy.
    fn slot_for(&self, slots: &mut Vec<Slot>, batch: &Batch) -> Result<usize, CudaError> {
        let images = batch.images().len();
        let labels = std::mem::size_of_val(batch.labels());
        let converted = images * self.out_dtype().bytes();
        let fits = |s: &Slot| {
            s.images_bytes >= images
                && s.labels_bytes >= labels
                && s.converted.is_none_or(|(_, n)| n >= converted)
        };
        if let Some(i) = slots
            .iter()
            .position(|s| !s.busy.load(Ordering::Acquire) && fits(s))
        {
            return Ok(i);
        }
        // Batches keep one size within an epoch (the last may be smaller), so the pool
        // settles at depth + 1 slots plus what the consumer holds.
        let (images_bytes, labels_bytes) = (images.max(1), labels.max(8));
        let ready_flags = match self.timed {
            true => sys::CUevent_flags::CU_EVENT_DEFAULT,
            false => sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
        };
        // SAFETY: plain device allocations, freed in `Shared::drop`.
        let slot = unsafe {
            Slot {
                images: call("cuMemAlloc", result::malloc_sync(images_bytes))?,
                images_bytes,
                converted: match self.convert {
                    Convert::None => None,
                    _ => Some((
                        call("cuMemAlloc", result::malloc_sync(converted.max(1)))?,
                        converted.max(1),
                    )),
                },
                labels: call("cuMemAlloc", result::malloc_sync(labels_bytes))?,
                labels_bytes,
                labels_host: call(
                    "cuMemHostAlloc",
                    result::malloc_host(labels_bytes, sys::CU_MEMHOSTALLOC_PORTABLE),
                )?
                .cast(),
                ready: call("cuEventCreate", result::event::create(ready_flags))?,
                released: call(
                    "cuEventCreate",
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
                )?,
                returned: call(
                    "cuEventCreate",
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING),
                )?,
                started: match self.timed {
                    true => Some(call(
                        "cuEventCreate",
                        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
                    )?),
                    false => None,
                },
                busy: Arc::new(AtomicBool::new(false)),
                used: Arc::new(AtomicBool::new(false)),
            }
        };
        slots.push(slot);
        Ok(slots.len() - 1)
    }

    /// Enqueues `batch`'s copy (and conversion); the batch and its slot travel together.
    fn upload(self: &Arc<Self>, mut batch: Batch) -> Result<DeviceBatch, CudaError> {
        self.gpu.bind()?;
        let mut slots = self.slots.lock().map_err(|_| CudaError::Call {
            what: "uploader",
            detail: "slot table poisoned".into(),
        })?;
        let i = self.slot_for(&mut slots, &batch)?;
        let s = &slots[i];
        s.busy.store(true, Ordering::Release);
        let stream = self.stream;
        // SAFETY: the slot's buffers are large enough (slot_for); the ring buffer stays
        // alive and unmoved until the host function enqueued after `ready` returns it; the
        // stream first waits until the previous user of the slot released it.
        unsafe {
            if s.used.load(Ordering::Acquire) {
                call(
                    "cuStreamWaitEvent",
                    result::stream::wait_event(
                        stream,
                        s.released,
                        sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                    ),
                )?;
            }
            if let Some(started) = s.started {
                call("cuEventRecord", result::event::record(started, stream))?;
            }
            call(
                "cuMemcpyHtoDAsync",
                result::memcpy_htod_async(s.images, batch.images(), stream),
            )?;
            // The slot's staging is free: its previous batch let the slot go only after its
            // copy had finished.
            let labels = batch.labels();
            let label_bytes = std::mem::size_of_val(labels);
            std::ptr::copy_nonoverlapping(labels.as_ptr().cast::<u8>(), s.labels_host, label_bytes);
            call(
                "cuMemcpyHtoDAsync",
                result::memcpy_htod_async(
                    s.labels,
                    std::slice::from_raw_parts(s.labels_host, label_bytes),
                    stream,
                ),
            )?;
            if let (Some(k), Some((out, _))) = (&self.kernel, s.converted) {
                self.launch(k, s.images, out, &batch, stream)?;
            }
            call("cuEventRecord", result::event::record(s.ready, stream))?;
        }
        let copied = (batch.images().len() + std::mem::size_of_val(batch.labels())) as u64;
        // The ring buffer goes back once the stream is past the copy.
        if let Some(buffer) = batch.detach_buffer() {
            let raw = Box::into_raw(Box::new(buffer));
            // SAFETY: `return_buffer` takes back exactly this box, once, and calls no CUDA.
            let queued =
                unsafe { result::stream::launch_host_function(stream, return_buffer, raw.cast()) };
            if queued.is_err() {
                // SAFETY: not enqueued, so still ours. Wait for the copy, then return it.
                let buffer = unsafe { Box::from_raw(raw) };
                let _ = unsafe { result::event::synchronize(s.ready) };
                drop(buffer);
            }
        }
        // SAFETY: a live event and stream.
        call("cuEventRecord", unsafe {
            result::event::record(s.returned, stream)
        })?;
        let dims = batch.dims();
        let shape = batch.shape();
        let (images, layout_chw) = match s.converted {
            Some((p, _)) => (p, true),
            None => (s.images, shape.chw),
        };
        let dims = if layout_chw && !shape.chw {
            [dims[0], dims[3], dims[1], dims[2]]
        } else {
            dims
        };
        Ok(DeviceBatch {
            shared: self.clone(),
            host: Some(batch),
            images,
            labels: s.labels,
            dims,
            dtype: self.out_dtype(),
            ready: s.ready,
            released: s.released,
            returned: s.returned,
            started: s.started,
            copied,
            busy: s.busy.clone(),
            used: s.used.clone(),
            consumers: Mutex::new(Vec::new()),
        })
    }

    unsafe fn launch(
        &self,
        k: &Kernel,
        src: sys::CUdeviceptr,
        dst: sys::CUdeviceptr,
        batch: &Batch,
        stream: sys::CUstream,
    ) -> Result<(), CudaError> {
        let (mean, std, half) = match self.convert {
            Convert::F32 { mean, std } => (mean, std, 0i32),
            Convert::F16 { mean, std } => (mean, std, 1i32),
            Convert::None => return Ok(()),
        };
        let s = batch.shape();
        if s.chw || s.elem_bytes != 1 || s.channels == 0 || s.channels > 3 {
            return Err(CudaError::Call {
                what: "conversion",
                detail: format!(
                    "needs uint8 HWC samples of 1 to 3 channels, the pipeline makes {s:?}"
                ),
            });
        }
        if batch.is_empty() {
            return Ok(());
        }
        let (mut src, mut dst) = (src, dst);
        // The kernel indexes within an image in 32 bits.
        let pixels = u64::from(s.height) * u64::from(s.width);
        let mut hw = i32::try_from(pixels)
            .ok()
            .filter(|_| pixels * u64::from(s.channels) <= i32::MAX as u64)
            .ok_or_else(|| CudaError::Call {
                what: "conversion",
                detail: format!("{}×{} images are too large to convert", s.height, s.width),
            })?;
        let mut c = s.channels as i32;
        let mut half = half;
        let scale = |i: usize| 1.0 / (255.0 * std[i]);
        let bias = |i: usize| -mean[i] / std[i];
        let (mut k0, mut k1, mut k2) = (scale(0), scale(1), scale(2));
        let (mut b0, mut b1, mut b2) = (bias(0), bias(1), bias(2));
        let mut params: [*mut c_void; 11] = [
            (&mut src as *mut sys::CUdeviceptr).cast(),
            (&mut dst as *mut sys::CUdeviceptr).cast(),
            (&mut hw as *mut i32).cast(),
            (&mut c as *mut i32).cast(),
            (&mut half as *mut i32).cast(),
            (&mut k0 as *mut f32).cast(),
            (&mut k1 as *mut f32).cast(),
            (&mut k2 as *mut f32).cast(),
            (&mut b0 as *mut f32).cast(),
            (&mut b1 as *mut f32).cast(),
            (&mut b2 as *mut f32).cast(),
        ];
        let blocks = (hw as u32).div_ceil(256).clamp(1, 1024);
        let images = u32::try_from(batch.len())
            .ok()
            .filter(|n| *n <= 65_535)
            .ok_or_else(|| CudaError::Call {
                what: "conversion",
                detail: format!("{} images in one batch; at most 65535", batch.len()),
            })?;
        call(
            "cuLaunchKernel",
            result::launch_kernel(
                k.function,
                (blocks, images, 1),
                (256, 1, 1),
                0,
                stream,
                &mut params,
            ),
        )
    }
}

/// Runs on a CUDA driver thread once the copy stream is past a batch's copy: hands the
/// batch's ring buffer back (a lock and a wake-up; no CUDA call).
unsafe extern "C" fn return_buffer(user: *mut c_void) {
    // SAFETY: made by Box::into_raw in `upload`, enqueued once.
    drop(unsafe { Box::from_raw(user.cast::<crate::batch::DetachedBuffer>()) });
}

/// An epoch's batches on the device, up to `depth` copies ahead of the consumer.
pub struct DeviceEpoch {
    host: Epoch,
    shared: Arc<Shared>,
    depth: usize,
    inflight: VecDeque<DeviceBatch>,
}

impl DeviceEpoch {
    /// The host epoch behind it (its report, its batch count).
    pub fn host(&self) -> &Epoch {
        &self.host
    }

    /// Like `next`, but gives up after `timeout` (`Err(())`) when no batch is ready to hand
    /// out, so a caller can check for interruptions while it waits.
    ///
    /// Every host batch that has arrived is queued for copying, up to `depth` behind the one
    /// handed out; the call waits for the host only when nothing is queued, so a batch whose
    /// copy is under way is never held back waiting for the next one to be made.
    #[allow(clippy::result_unit_err)]
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<DeviceBatch, ClientError>>, ()> {
        while self.inflight.len() <= self.depth {
            let wait = match self.inflight.is_empty() {
                true => timeout,
                false => Duration::ZERO,
            };
            match self.host.next_timeout(wait) {
                Err(()) if self.inflight.is_empty() => return Err(()),
                Err(()) | Ok(None) => break,
                Ok(Some(Err(e))) => return Ok(Some(Err(e))),
                Ok(Some(Ok(batch))) => match self.shared.upload(batch) {
                    Ok(d) => self.inflight.push_back(d),
                    Err(e) => return Ok(Some(Err(ClientError::Cuda(e.to_string())))),
                },
            }
        }
        Ok(self.inflight.pop_front().map(Ok))
    }
}

impl Iterator for DeviceEpoch {
    type Item = Result<DeviceBatch, ClientError>;

    /// Blocks until the next batch's copy is enqueued (not finished: see [`DeviceBatch`]).
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Ok(item) = self.next_timeout(Duration::from_millis(500)) {
                return item;
            }
        }
    }
}

/// A batch on the device. Make the consuming stream wait on it with [`DeviceBatch::wait_on`]
/// (or block with [`DeviceBatch::synchronize`]); dropping it hands its buffers back once the
/// work queued on those streams is done with them.
pub struct DeviceBatch {
    shared: Arc<Shared>,
    host: Option<Batch>,
    images: sys::CUdeviceptr,
    labels: sys::CUdeviceptr,
    dims: [usize; 4],
    dtype: DType,
    ready: sys::CUevent,
    released: sys::CUevent,
    returned: sys::CUevent,
    started: Option<sys::CUevent>,
    /// Host bytes the copy moved.
    copied: u64,
    busy: Arc<AtomicBool>,
    used: Arc<AtomicBool>,
    /// The streams that were made to wait on this batch (`wait_on`), in order.
    consumers: Mutex<Vec<sys::CUstream>>,
}

// CUDA handles; the host batch is Send.
unsafe impl Send for DeviceBatch {}

impl DeviceBatch {
    /// The images' device address: `dims()` elements of `dtype()`.
    pub fn images_ptr(&self) -> u64 {
        self.images
    }

    /// The labels' device address: `len()` int64 values.
    pub fn labels_ptr(&self) -> u64 {
        self.labels
    }

    /// (N, H, W, C) for uint8 NHWC batches, (N, C, H, W) for converted or channels-first ones.
    pub fn dims(&self) -> [usize; 4] {
        self.dims
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The ordinal of the device the batch is on.
    pub fn device(&self) -> usize {
        self.shared.gpu.ordinal
    }

    pub fn len(&self) -> usize {
        self.dims[0]
    }

    pub fn is_empty(&self) -> bool {
        self.dims[0] == 0
    }

    /// The event recorded when the copy (and conversion) finished.
    pub fn ready_event(&self) -> sys::CUevent {
        self.ready
    }

    /// The stream the copy ran on.
    pub fn copy_stream(&self) -> sys::CUstream {
        self.shared.stream
    }

    /// The host side: ids, keys, labels, padding, skips. Its images are empty: the buffer
    /// went back to the ring once the copy had read it.
    pub fn host(&self) -> Option<&Batch> {
        self.host.as_ref()
    }

    /// Makes `stream` wait for the copy without blocking the host; the buffers are reused
    /// only after the work queued on every such stream before this batch is dropped.
    ///
    /// # Safety
    /// `stream` must be a live stream of this batch's device context, or one of CUDA's
    /// special handles (null or `CU_STREAM_LEGACY` = 1 for the legacy default stream,
    /// `CU_STREAM_PER_THREAD` = 2), and stay alive until the batch is dropped.
    pub unsafe fn wait_on(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        self.shared.gpu.bind()?;
        // SAFETY: both handles are alive; waiting does not block the host.
        call("cuStreamWaitEvent", unsafe {
            result::stream::wait_event(
                stream,
                self.ready,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })?;
        if let Ok(mut c) = self.consumers.lock() {
            if !c.contains(&stream) {
                c.push(stream);
            }
        }
        Ok(())
    }

    /// Blocks until the copy is done.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.shared.gpu.bind()?;
        // SAFETY: the event is alive.
        call("cuEventSynchronize", unsafe {
            result::event::synchronize(self.ready)
        })
    }

    /// Adds this batch's copy to the uploader's timing (timed uploaders only).
    fn account(&self) {
        let Some(started) = self.started else {
            return;
        };
        // SAFETY: both events were recorded on the copy stream and `ready` has completed.
        if let Ok(ms) = unsafe { result::event::elapsed(started, self.ready) } {
            let t = &self.shared.timing;
            t.bytes.fetch_add(self.copied, Ordering::Relaxed);
            t.nanos
                .fetch_add((f64::from(ms) * 1e6) as u64, Ordering::Relaxed);
            t.batches.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for DeviceBatch {
    fn drop(&mut self) {
        if self.shared.gpu.bind().is_err() {
            return;
        }
        let consumers = self.consumers.lock().map(|c| c.clone()).unwrap_or_default();
        // SAFETY: handles are alive (Shared outlives this batch), and the consumer streams
        // are alive by `wait_on`'s contract. The host batch returns to the ring only after
        // the copy read it.
        unsafe {
            // `returned` follows `ready`: the copy is done and the ring buffer is back.
            let _ = result::event::synchronize(self.returned);
            self.account();
            drop(self.host.take());
            // The slot may be refilled after the consumers' queued work (or, if none said
            // which stream it used, after the copy itself). With several consumer streams,
            // the copy stream waits on each but the last now (cuStreamWaitEvent takes the
            // event's state at the call), and on the last when the slot is refilled.
            let stream = match consumers.split_last() {
                None => self.shared.stream,
                Some((last, others)) => {
                    for s in others {
                        if result::event::record(self.released, *s).is_ok() {
                            let _ = result::stream::wait_event(
                                self.shared.stream,
                                self.released,
                                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                            );
                        }
                    }
                    *last
                }
            };
            if result::event::record(self.released, stream).is_ok() {
                self.used.store(true, Ordering::Release);
            }
        }
        self.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs only where a GPU is present; elsewhere says why it skipped.
    fn gpu() -> Option<Arc<Gpu>> {
        match Gpu::open(0) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    #[test]
    fn without_a_driver_the_error_says_so() {
        match Gpu::open(0) {
            Err(CudaError::NoDriver) => {
                assert!(CudaError::NoDriver.to_string().contains("no NVIDIA driver"))
            }
            Err(e) => eprintln!("a driver is present: {e}"),
            Ok(_) => eprintln!("a GPU is present; the GPU tests below run"),
        }
    }

    /// Every sample of shard index 0 is 4×4×3 bytes of value `index`.
    struct Ramp;

    impl sluice_wire::UnitRunner for Ramp {
        fn open_job(
            &self,
            _: &sluice_wire::JobSpec,
        ) -> Result<Box<dyn sluice_wire::JobRunner>, String> {
            Ok(Box::new(Ramp))
        }
        fn threads(&self) -> u32 {
            1
        }
    }

    impl sluice_wire::JobRunner for Ramp {
        fn shape(&self) -> sluice_wire::SampleShape {
            sluice_wire::SampleShape {
                height: 4,
                width: 4,
                channels: 3,
                elem_bytes: 1,
                chw: false,
            }
        }
        fn run(
            &self,
            a: &sluice_wire::Assign,
            emit: &mut dyn FnMut(sluice_wire::Output) -> bool,
        ) -> Result<sluice_wire::Finished, String> {
            for index in a.start..a.end {
                let header = sluice_wire::SampleHeader {
                    job: a.job,
                    unit: a.unit,
                    attempt: a.attempt,
                    shard: a.shard.index,
                    index,
                    key: format!("{index}"),
                    label: Some(index as i64),
                    tensor_bytes: 48,
                    fields: Vec::new(),
                };
                if !emit(sluice_wire::Output::Sample(header, vec![index as u8; 48])) {
                    return Err("cancelled".into());
                }
            }
            Ok(sluice_wire::Finished {
                sent: a.end - a.start,
                skipped: 0,
            })
        }
    }

    fn loader(gpu: &Arc<Gpu>) -> crate::Loader {
        loader_with_ring(gpu, 4)
    }

    fn loader_with_ring(gpu: &Arc<Gpu>, ring_batches: usize) -> crate::Loader {
        let manifest = sluice_shard::Manifest::new(vec![sluice_shard::ShardInfo {
            url: "synthetic://ramp".into(),
            size: 100 << 20, // synthetic: room for the count, no bytes
            samples: 100,
            checksum: sluice_shard::Checksum(0),
            compression: sluice_shard::Compression::None,
        }]);
        crate::Loader::builder()
            .dataset(manifest)
            .in_process(Arc::new(Ramp))
            .batch_size(16)
            .ring_batches(ring_batches)
            .allocator(Arc::new(PinnedAllocator::new(gpu.clone())))
            .build()
            .unwrap()
    }

    /// What `Ramp` made for the batch's samples.
    fn ramp_bytes(host: &Batch) -> Vec<u8> {
        host.ids()
            .iter()
            .flat_map(|id| vec![id.index as u8; 48])
            .collect()
    }

    fn download(gpu: &Gpu, ptr: sys::CUdeviceptr, bytes: usize) -> Vec<u8> {
        gpu.bind().unwrap();
        let mut out = vec![0u8; bytes];
        unsafe { result::memcpy_dtoh_sync(&mut out, ptr) }.unwrap();
        out
    }

    #[test]
    fn device_batches_hold_exactly_the_host_bytes() {
        let Some(gpu) = gpu() else { return };
        let uploader = Uploader::new(gpu.clone(), Convert::None, 2).unwrap();
        let l = loader(&gpu);
        let mut seen = 0;
        for d in uploader.epoch(l.epoch(0).unwrap()) {
            let d = d.unwrap();
            d.synchronize().unwrap();
            let host = d.host().unwrap();
            let bytes = download(&gpu, d.images_ptr(), host.len() * 48);
            assert_eq!(bytes, ramp_bytes(host));
            let labels = download(&gpu, d.labels_ptr(), host.len() * 8);
            let labels: Vec<i64> = labels
                .chunks(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(labels, host.labels());
            assert_eq!(d.dtype(), DType::U8);
            seen += d.len();
        }
        assert_eq!(seen, 100);
    }

    #[test]
    fn conversion_normalizes_into_nchw_f32() {
        let Some(gpu) = gpu() else { return };
        let (mean, std) = ([0.5, 0.25, 0.0], [0.5, 0.25, 1.0]);
        let uploader = match Uploader::new(gpu.clone(), Convert::F32 { mean, std }, 1) {
            Ok(u) => u,
            Err(e @ CudaError::Nvrtc(_)) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let l = loader(&gpu);
        let d = uploader.epoch(l.epoch(0).unwrap()).next().unwrap().unwrap();
        d.synchronize().unwrap();
        let host = d.host().unwrap();
        assert_eq!(d.dims(), [host.len(), 3, 4, 4]);
        let out = download(&gpu, d.images_ptr(), host.len() * 48 * 4);
        let out: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for (i, id) in host.ids().iter().enumerate() {
            for c in 0..3 {
                let want = (id.index as u8 as f32 / 255.0 - mean[c]) / std[c];
                let got = out[(i * 3 + c) * 16];
                assert!(
                    (got - want).abs() < 1e-5,
                    "sample {i} channel {c}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_timed_uploader_counts_every_copied_byte() {
        let Some(gpu) = gpu() else { return };
        let uploader = Uploader::timed(gpu.clone(), Convert::None, 1).unwrap();
        let l = loader(&gpu);
        let mut batches = 0;
        for d in uploader.epoch(l.epoch(0).unwrap()) {
            d.unwrap();
            batches += 1;
        }
        let stats = uploader.copy_stats();
        assert_eq!(stats.batches, batches);
        // 100 samples of 48 bytes, and an int64 label each.
        assert_eq!(stats.bytes, 100 * 48 + 100 * 8);
        assert!(stats.seconds > 0.0);
    }

    #[test]
    fn every_consumer_stream_sees_the_copy_and_holds_the_buffer() {
        let Some(gpu) = gpu() else { return };
        let uploader = Uploader::new(gpu.clone(), Convert::None, 1).unwrap();
        let l = loader(&gpu);
        let streams: Vec<sys::CUstream> = (0..2)
            .map(|_| result::stream::create(result::stream::StreamKind::NonBlocking).unwrap())
            .collect();
        let mut seen = 0;
        for d in uploader.epoch(l.epoch(0).unwrap()) {
            let d = d.unwrap();
            let host = ramp_bytes(d.host().unwrap());
            for s in &streams {
                // SAFETY: live streams of this context, destroyed after the loop.
                unsafe { d.wait_on(*s) }.unwrap();
                // Read the batch back on the consumer's stream, ordered after the copy by
                // the wait alone.
                let mut back = vec![0u8; host.len()];
                unsafe {
                    result::memcpy_dtoh_async(&mut back, d.images_ptr(), *s).unwrap();
                    result::stream::synchronize(*s).unwrap();
                }
                assert_eq!(back, host);
            }
            seen += d.len();
        }
        assert_eq!(seen, 100);
        for s in streams {
            unsafe { result::stream::destroy(s) }.unwrap();
        }
    }

    #[test]
    fn held_device_batches_do_not_hold_the_ring() {
        let Some(gpu) = gpu() else { return };
        let uploader = Uploader::new(gpu.clone(), Convert::None, 1).unwrap();
        // Two ring buffers, seven batches all held at once: each buffer went back to the
        // ring as soon as its copy had read it.
        let l = loader_with_ring(&gpu, 2);
        let held: Vec<DeviceBatch> = uploader
            .epoch(l.epoch(0).unwrap())
            .map(|d| d.unwrap())
            .collect();
        assert_eq!(held.len(), 7);
        for d in &held {
            d.synchronize().unwrap();
            let host = d.host().unwrap();
            assert_eq!(
                download(&gpu, d.images_ptr(), host.len() * 48),
                ramp_bytes(host)
            );
        }
    }

    #[test]
    fn pinned_buffers_are_writable_and_zeroed() {
        let Some(gpu) = gpu() else { return };
        let mut m = PinnedAllocator::new(gpu).allocate(1 << 20).unwrap();
        assert!(m.as_slice().iter().all(|b| *b == 0));
        m.as_mut_slice()[123] = 7;
        assert_eq!(m.as_slice()[123], 7);
    }
}
