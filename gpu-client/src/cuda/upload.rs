//! The uploader: device buffer sets reused in turn, each host batch copied (and converted) on
//! the uploader's stream while the previous step computes, and the device batches handed out
//! with the events that order their use and refill (see the module above for the protocol).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{result, sys};

/// The CUDA bindings this module is built on, for callers that drive the device themselves
/// (benchmarks, the Python binding's stream handling).
pub use cudarc;

use super::convert::{Convert, DType, Kernel};
use super::device::Gpu;
use super::{call, CudaError};
use crate::batch::Batch;
use crate::error::ClientError;
use crate::loader::Epoch;

/// One reusable set of device buffers.
pub(crate) struct Slot {
    pub(crate) images: sys::CUdeviceptr,
    pub(crate) images_bytes: usize,
    /// The converted images, when converting.
    pub(crate) converted: Option<(sys::CUdeviceptr, usize)>,
    pub(crate) labels: sys::CUdeviceptr,
    pub(crate) labels_bytes: usize,
    /// Page-locked staging for the labels (`labels_bytes`).
    pub(crate) labels_host: *mut u8,
    pub(crate) ready: sys::CUevent,
    pub(crate) released: sys::CUevent,
    /// Recorded after the host function that returns the ring buffer: once it completes, that
    /// function has run, so the batch's last hold on its ring is never dropped on a driver
    /// thread (freeing page-locked memory there would be a CUDA call).
    pub(crate) returned: sys::CUevent,
    /// Recorded just before the copy, when the uploader times its copies.
    pub(crate) started: Option<sys::CUevent>,
    /// A batch handed out holds this slot.
    pub(crate) busy: Arc<AtomicBool>,
    /// `released` has been recorded at least once (else there is nothing to wait for).
    pub(crate) used: Arc<AtomicBool>,
}

pub(crate) struct Shared {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) stream: sys::CUstream,
    pub(crate) slots: Mutex<Vec<Slot>>,
    pub(crate) kernel: Option<Kernel>,
    pub(crate) convert: Convert,
    /// Whether copies are bracketed by timing events (`Uploader::timed`).
    pub(crate) timed: bool,
    pub(crate) timing: CopyTiming,
}

/// What the timed copies added up to.
#[derive(Default)]
pub(crate) struct CopyTiming {
    pub(crate) bytes: AtomicU64,
    pub(crate) nanos: AtomicU64,
    pub(crate) batches: AtomicU64,
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
    pub(crate) shared: Arc<Shared>,
    pub(crate) depth: usize,
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

    pub(crate) fn build(
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
    pub(crate) fn out_dtype(&self) -> DType {
        match self.convert {
            Convert::None => DType::U8,
            Convert::F16 { .. } => DType::F16,
            Convert::F32 { .. } => DType::F32,
        }
    }

    /// A free slot large enough for `batch`, growing the pool when every slot is busy.
    pub(crate) fn slot_for(
        &self,
        slots: &mut Vec<Slot>,
        batch: &Batch,
    ) -> Result<usize, CudaError> {
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
    pub(crate) fn upload(self: &Arc<Self>, mut batch: Batch) -> Result<DeviceBatch, CudaError> {
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
        // Converted on the device: each image (or clip frame) channels first.
        let dims = match (layout_chw && !shape.chw, dims.as_slice()) {
            (true, [n, h, w, c]) => vec![*n, *c, *h, *w],
            (true, [n, t, h, w, c]) => vec![*n, *t, *c, *h, *w],
            _ => dims,
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

    pub(crate) unsafe fn launch(
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
        // A clip's frames are images of their own here, one after another.
        let n = batch.len() * s.frames.max(1) as usize;
        let images = u32::try_from(n)
            .ok()
            .filter(|n| *n <= 65_535)
            .ok_or_else(|| CudaError::Call {
                what: "conversion",
                detail: format!("{n} images (or clip frames) in one batch; at most 65535"),
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
    pub(crate) host: Epoch,
    pub(crate) shared: Arc<Shared>,
    pub(crate) depth: usize,
    pub(crate) inflight: VecDeque<DeviceBatch>,
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

// `next` blocks until the next batch's copy is enqueued (not finished: see [`DeviceBatch`]).
crate::loader::blocking_iterator!(DeviceEpoch, DeviceBatch);

/// A batch on the device. Make the consuming stream wait on it with [`DeviceBatch::wait_on`]
/// (or block with [`DeviceBatch::synchronize`]); dropping it hands its buffers back once the
/// work queued on those streams is done with them.
pub struct DeviceBatch {
    pub(crate) shared: Arc<Shared>,
    pub(crate) host: Option<Batch>,
    pub(crate) images: sys::CUdeviceptr,
    pub(crate) labels: sys::CUdeviceptr,
    pub(crate) dims: Vec<usize>,
    pub(crate) dtype: DType,
    pub(crate) ready: sys::CUevent,
    pub(crate) released: sys::CUevent,
    pub(crate) returned: sys::CUevent,
    pub(crate) started: Option<sys::CUevent>,
    /// Host bytes the copy moved.
    pub(crate) copied: u64,
    pub(crate) busy: Arc<AtomicBool>,
    pub(crate) used: Arc<AtomicBool>,
    /// The streams that were made to wait on this batch (`wait_on`), in order.
    pub(crate) consumers: Mutex<Vec<sys::CUstream>>,
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
    pub fn dims(&self) -> &[usize] {
        &self.dims
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
    pub(crate) fn account(&self) {
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
