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
//!
//! Modules: [`device`] (the device's context and page-locked host memory), [`convert`] (what a
//! batch becomes on the GPU and the kernel that does it) and [`upload`] (the uploader, its
//! device buffers and the batches it hands out).

use cudarc::driver::result;

/// The CUDA bindings this module is built on, for callers that drive the device themselves
/// (benchmarks, the Python binding's stream handling).
pub use cudarc;

mod convert;
mod device;
mod upload;

pub use convert::{Convert, DType};
pub use device::{Gpu, PinnedAllocator};
pub use upload::{CopyStats, DeviceBatch, DeviceEpoch, Uploader};

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

pub(crate) fn call<T>(
    what: &'static str,
    r: Result<T, result::DriverError>,
) -> Result<T, CudaError> {
    r.map_err(|e| CudaError::Call {
        what,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use cudarc::driver::sys;

    use super::*;
    use crate::batch::{Batch, HostAllocator, HostMemory};

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

    /// The same-host batch arena, adopted by the CUDA allocator, is page-locked shared
    /// memory: the driver reports it registered, and a batch in it reaches the device intact.
    #[test]
    fn the_batch_arena_is_page_locked_and_uploads_from_it() {
        let Some(gpu) = gpu() else { return };
        let pinned = PinnedAllocator::new(gpu.clone());
        let arena = crate::arena::Arena::create((2, 4, 1024, 1), &pinned)
            .expect("cuMemHostRegister of the arena")
            .expect("the CUDA allocator adopts it");
        let mut buffer = arena.take().expect("a free buffer");
        let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        buffer.as_mut_slice().copy_from_slice(&bytes);
        let host = buffer.as_slice().as_ptr();
        gpu.bind().unwrap();
        let mut flags = 0u32;
        // SAFETY: a pointer into the registered range.
        let r = unsafe { sys::cuMemHostGetFlags(&mut flags, host as *mut _) };
        r.result().expect("the arena is registered with the driver");
        // SAFETY: plain device allocation and synchronous copies of 4,096 bytes.
        unsafe {
            let dev = cudarc::driver::result::malloc_sync(4096).unwrap();
            cudarc::driver::result::memcpy_htod_sync(dev, buffer.as_slice()).unwrap();
            let mut back = vec![0u8; 4096];
            cudarc::driver::result::memcpy_dtoh_sync(&mut back, dev).unwrap();
            cudarc::driver::result::free_sync(dev).unwrap();
            assert_eq!(back, bytes);
        }
    }

    /// Every sample of shard index 0 is 4×4×3 bytes of value `index`.
    struct Ramp;

    impl sluice_wire::UnitRunner for Ramp {
        fn open_job(
            &self,
            _: &sluice_wire::JobSpec,
        ) -> Result<Box<dyn sluice_wire::JobRunner>, sluice_wire::RunnerError> {
            Ok(Box::new(Ramp))
        }
        fn threads(&self) -> u32 {
            1
        }
    }

    impl sluice_wire::JobRunner for Ramp {
        fn shape(&self) -> sluice_wire::SampleShape {
            sluice_wire::SampleShape::image_u8(4, 4, 3)
        }
        fn run(
            &self,
            a: &sluice_wire::Assign,
            emit: &mut dyn FnMut(sluice_wire::Output) -> bool,
        ) -> Result<sluice_wire::Finished, sluice_wire::RunnerError> {
            crate::testing::emit_unit(a, emit, |index| (index as i64, vec![index as u8; 48]))
        }
    }

    fn loader(gpu: &Arc<Gpu>) -> crate::loader::Loader {
        loader_with_ring(gpu, 4)
    }

    fn loader_with_ring(gpu: &Arc<Gpu>, ring_batches: usize) -> crate::loader::Loader {
        let manifest = sluice_shard::Manifest::new(vec![sluice_shard::ShardInfo {
            url: "synthetic://ramp".into(),
            size: 100 << 20, // synthetic: room for the count, no bytes
            samples: 100,
            checksum: sluice_shard::Checksum(0),
            compression: sluice_shard::Compression::None,
            replicas: Vec::new(),
        }]);
        crate::loader::Loader::builder()
            .dataset(manifest)
            .in_process(Arc::new(Ramp))
            .batch_size(16)
            // The tests read epoch 0 and count its ring buffers: none is started behind it.
            .epochs(1)
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
