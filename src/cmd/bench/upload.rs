//! `sluice bench upload` (feature `cuda`): host-to-device throughput of the client's upload
//! path beside a plain page-locked copy of the same bytes, on one GPU, in one run.
//!
//! - plain: one `cuMemHostAlloc` buffer of a batch's bytes copied to one device buffer, timed
//!   with CUDA events around `cuMemcpyHtoDAsync` (and, for reference, by the wall clock
//!   around a synchronous `cuMemcpyHtoD`), `repeat` times.
//! - ring: a real `Loader` (an in-process worker that sends ready-made tensors, so nothing is
//!   decoded) filling its page-locked ring, and the `Uploader` copying each batch on its own
//!   stream, timed with the same events around each batch's copies. Its wall-clock rate is
//!   printed too: it is bounded by how fast the host fills the ring, not by the copy.
//!
//! The ratio ring/plain compares the two copy rates as the GPU saw them.

use anyhow::Result;

#[derive(clap::Args)]
pub struct UploadArgs {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    #[arg(long, default_value_t = 256)]
    batch_size: u32,
    /// Tensor side (side × side × 3 bytes per sample).
    #[arg(long, default_value_t = 224)]
    side: u32,
    /// Batches through the ring.
    #[arg(long, default_value_t = 64)]
    batches: u64,
    /// Plain copies of one batch.
    #[arg(long, default_value_t = 64)]
    repeat: u32,
    /// Copies queued ahead of the consumer.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// Element type on the device: uint8 (the copy alone), or float16/float32 converted to
    /// NCHW with ImageNet's mean and std after the copy.
    #[arg(long, default_value = "uint8")]
    dtype: String,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[cfg(not(feature = "cuda"))]
pub fn run(_args: UploadArgs) -> Result<()> {
    anyhow::bail!(
        "this sluice was built without CUDA support: cargo build --release --features cuda"
    )
}

#[cfg(feature = "cuda")]
pub fn run(args: UploadArgs) -> Result<()> {
    gpu::run(args)
}

#[cfg(feature = "cuda")]
mod gpu {
    use std::sync::Arc;
    use std::time::Instant;

    use anyhow::{bail, Context, Result};
    use sluice_client::cuda::cudarc::driver::{result, sys};
    use sluice_client::cuda::{Convert, Gpu, PinnedAllocator, Uploader};
    use sluice_shard::{Checksum, Compression, Manifest, ShardInfo};

    use super::UploadArgs;
    use sluice_testbed::transport::Synthetic;

    struct Plain {
        events_bps: f64,
        sync_bps: f64,
    }

    /// A page-locked buffer, a device buffer and a stream, freed on drop.
    struct PlainSetup {
        host: *mut std::ffi::c_void,
        dev: sys::CUdeviceptr,
        stream: sys::CUstream,
        start: sys::CUevent,
        stop: sys::CUevent,
    }

    impl Drop for PlainSetup {
        fn drop(&mut self) {
            // SAFETY: each handle was made in `plain` and is freed once, after the stream.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::event::destroy(self.start);
                let _ = result::event::destroy(self.stop);
                let _ = result::stream::destroy(self.stream);
                let _ = result::free_sync(self.dev);
                let _ = result::free_host(self.host);
            }
        }
    }

    fn plain(gpu: &Gpu, bytes: usize, repeat: u32) -> Result<Plain> {
        gpu.bind()?;
        // SAFETY: plain allocations of `bytes`, used only below and freed by PlainSetup.
        let s = unsafe {
            PlainSetup {
                host: result::malloc_host(bytes, 0).context("cuMemHostAlloc")?,
                dev: result::malloc_sync(bytes).context("cuMemAlloc")?,
                stream: result::stream::create(result::stream::StreamKind::NonBlocking)
                    .context("cuStreamCreate")?,
                start: result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .context("cuEventCreate")?,
                stop: result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .context("cuEventCreate")?,
            }
        };
        // SAFETY: `host` holds `bytes` bytes until PlainSetup drops.
        let src = unsafe { std::slice::from_raw_parts_mut(s.host.cast::<u8>(), bytes) };
        src.fill(0x5a);
        let mut gpu_ms = 0f64;
        // SAFETY: `src` and `dev` hold `bytes` bytes; the stream is synchronized before the
        // events are read and before anything is freed.
        unsafe {
            // One warm-up copy.
            result::memcpy_htod_sync(s.dev, &*src).context("cuMemcpyHtoD")?;
            for _ in 0..repeat {
                result::event::record(s.start, s.stream)?;
                result::memcpy_htod_async(s.dev, &*src, s.stream).context("cuMemcpyHtoDAsync")?;
                result::event::record(s.stop, s.stream)?;
                result::event::synchronize(s.stop)?;
                gpu_ms += f64::from(result::event::elapsed(s.start, s.stop)?);
            }
        }
        let started = Instant::now();
        for _ in 0..repeat {
            // SAFETY: as above.
            unsafe { result::memcpy_htod_sync(s.dev, &*src) }.context("cuMemcpyHtoD")?;
        }
        let wall = started.elapsed().as_secs_f64();
        let total = bytes as f64 * f64::from(repeat);
        Ok(Plain {
            events_bps: total / (gpu_ms * 1e-3),
            sync_bps: total / wall,
        })
    }

    struct Ring {
        copy_bps: f64,
        wall_bps: f64,
        batches: u64,
        samples: u64,
    }

    fn ring(gpu: &Arc<Gpu>, args: &UploadArgs, convert: Convert) -> Result<Ring> {
        let (runner, shape) = Synthetic::rgb(args.side);
        let per_shard = u64::from(args.batch_size) * 4;
        let shards = args.batches.div_ceil(4).max(1);
        let manifest = Manifest::new(
            (0..shards)
                .map(|i| ShardInfo {
                    url: format!("synthetic://upload/{i}"),
                    size: per_shard << 20, // synthetic: room for the count, no bytes
                    samples: per_shard,
                    checksum: Checksum(0),
                    compression: Compression::None,
                    replicas: Vec::new(),
                })
                .collect(),
        );
        let loader = sluice_client::Loader::builder()
            .dataset(manifest)
            .in_process(runner)
            .pipeline(format!("decode | center_crop {}", args.side))
            .batch_size(args.batch_size)
            // One epoch is measured: none is started behind it.
            .epochs(1)
            .ring_batches(args.depth + 4)
            .allocator(Arc::new(PinnedAllocator::new(gpu.clone())))
            .build()?;
        let uploader = Uploader::timed(gpu.clone(), convert, args.depth)?;
        // CU_STREAM_LEGACY: the legacy default stream, as a training step would use.
        let consumer = 1usize as sys::CUstream;
        let started = Instant::now();
        let (mut batches, mut samples) = (0u64, 0u64);
        for d in uploader.epoch(loader.epoch(0)?) {
            let d = d?;
            // The consumer's stream waits for the copy; the next batch's copy is already
            // queued behind this one.
            // SAFETY: a special handle, valid as long as the context.
            unsafe { d.wait_on(consumer) }?;
            batches += 1;
            samples += d.len() as u64;
            if batches >= args.batches {
                break;
            }
        }
        gpu.bind()?;
        // SAFETY: the legacy default stream.
        unsafe { result::stream::synchronize(consumer) }?;
        let wall = started.elapsed().as_secs_f64();
        let stats = uploader.copy_stats();
        Ok(Ring {
            copy_bps: stats.bytes_per_s(),
            wall_bps: samples as f64 * shape.bytes() as f64 / wall,
            batches: stats.batches,
            samples,
        })
    }

    pub(super) fn run(args: UploadArgs) -> Result<()> {
        let Some(convert) =
            Convert::to_dtype(&args.dtype, Convert::IMAGENET_MEAN, Convert::IMAGENET_STD)
        else {
            bail!("--dtype {}: expected uint8, float16 or float32", args.dtype);
        };
        let gpu = Gpu::open(args.device)?;
        let sample = args.side as usize * args.side as usize * 3;
        let bytes = sample * args.batch_size as usize + 8 * args.batch_size as usize;
        println!(
            "sluice bench upload: GPU {}, batches of {} × {} bytes ({:.1} MB), depth {}, dtype {}",
            args.device,
            args.batch_size,
            sample,
            bytes as f64 / 1e6,
            args.depth,
            args.dtype
        );
        let p = plain(&gpu, bytes, args.repeat.max(1))?;
        let r = ring(&gpu, &args, convert)?;
        let line = |what: &str, v: f64| println!("upload\t{what}\t{:.2} GB/s", v / 1e9);
        line("plain pinned cuMemcpyHtoDAsync (events)", p.events_bps);
        line("plain pinned cuMemcpyHtoD (wall clock)", p.sync_bps);
        line("ring → device, copy time (events)", r.copy_bps);
        line(
            "ring → device, wall clock (host filling the ring)",
            r.wall_bps,
        );
        let ratio = r.copy_bps / p.events_bps;
        println!("upload\tring/plain\t{ratio:.3}");
        println!("upload\tbatches\t{} ({} samples)", r.batches, r.samples);
        if let Some(path) = &args.json {
            let v = serde_json::json!({
                "device": args.device,
                "batch_bytes": bytes,
                "dtype": args.dtype,
                "plain_events_gbps": p.events_bps / 1e9,
                "plain_sync_gbps": p.sync_bps / 1e9,
                "ring_copy_gbps": r.copy_bps / 1e9,
                "ring_wall_gbps": r.wall_bps / 1e9,
                "ring_over_plain": ratio,
                "batches": r.batches,
            });
            std::fs::write(path, serde_json::to_vec_pretty(&v)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }
}
