//! The engine: turns samples into tensors on a rayon pool.
//!
//! Per sample: find the image field, read the header, compose the pipeline's geometry into one
//! source window ([`crate::geometry`]), decode only that window at the smallest SIMD DCT
//! scale (1/8, 2/8, 4/8, 8/8) that keeps at least one source pixel per output pixel
//! ([`crate::jpeg`]), resample it once with SIMD (`fast_image_resize`, the Pillow/torchvision
//! antialiased bilinear filter) straight from the decoder's buffer into the output tensor,
//! then flip and convert in place. Each pool thread keeps its decoder and buffers, and the
//! output tensor comes from a pool the transport returns it to, so once warm the hot path
//! allocates no image memory.
//!
//! Every random draw comes from the sample's stream, seeded by (job seed, epoch, shard, index
//! in shard): the output is byte-identical whichever thread or worker makes it. A sample that
//! cannot be decoded (corrupt, truncated, too large, no image, even a decoder panic) becomes a
//! [`SampleError`] and, by the bad-sample policy, a reported skip or a unit failure.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fast_image_resize::Resizer;
use serde::{Deserialize, Serialize};
use sluice_plan::rng::sample_stream;
use sluice_shard::{Field, Sample, ShardError};
use sluice_wire::SampleGeometry;

use crate::error::{DecodeError, EngineError, SampleError};
use crate::fields::FieldSpec;
use crate::jpeg::{DecodeLimits, JpegDecoder};
use sluice_wire::spec::PipelineSpec;

mod pixels;
mod render;
mod unit;

/// What happens to a sample that cannot be decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadSamplePolicy {
    /// Report it as skipped (shard, key, reason) and go on.
    #[default]
    Skip,
    /// Fail the work unit.
    Fail,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Decode threads; 0 means one per core.
    pub threads: usize,
    pub limits: DecodeLimits,
    /// Decode at a reduced DCT scale when the output is smaller than the crop.
    pub dct_scaling: bool,
    /// Decode only the crop window.
    pub roi_decode: bool,
    pub policy: BadSamplePolicy,
    /// Samples parsed ahead of the decoders, and results waiting for the consumer.
    pub readahead: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            threads: 0,
            limits: DecodeLimits::default(),
            dct_scaling: true,
            roi_decode: true,
            policy: BadSamplePolicy::Skip,
            readahead: 64,
        }
    }
}

/// The job coordinates that seed a sample's augmentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleContext {
    pub seed: u64,
    pub epoch: u64,
    /// The shard's index in the manifest.
    pub shard: u32,
}

pub use crate::tensor::Tensor;

/// Where a unit's samples may be written straight into the client's batches: the job's
/// places and the unit's (unit, attempt).
#[derive(Clone)]
pub struct PlaceTarget {
    pub places: Arc<dyn sluice_wire::Places>,
    pub unit: u64,
    pub attempt: u32,
}

/// The place of the sample being processed, if the client gave it one.
type Dest<'a> = Option<(&'a PlaceTarget, u64)>;

/// A sample's label, the fields its job asked for, and the names it has when one is missing.
type OwnParts = (Option<i64>, Vec<Field>, Vec<String>);

/// A processed sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Processed {
    pub shard: u32,
    pub index: u64,
    pub key: String,
    /// The label, from the field the job names (`None` for a job without labels).
    pub label: Option<i64>,
    pub tensor: Tensor,
    /// The fields the job asked for, untouched (never the image).
    pub fields: Vec<Field>,
    /// The crop and flip that made the tensor from the source image.
    pub geometry: SampleGeometry,
    /// Every field the sample has, when one the job asked for by name is missing (empty
    /// otherwise): the client names them to a user with a typo in `fields=`.
    pub has: Vec<String>,
    /// Its tensor was copied from a decode made for another job of its sweep
    /// ([`crate::share`]), not decoded for it.
    pub shared: bool,
}

/// What became of one sample.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Done(Processed),
    Skipped(SampleError),
}

/// Cumulative time per stage, in nanoseconds (summed over threads).
#[derive(Debug, Default)]
pub struct StageTimes {
    pub fetch_parse_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub transform_ns: AtomicU64,
    pub samples: AtomicU64,
    pub skipped: AtomicU64,
}

/// Counts of one work unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnitStats {
    pub done: u64,
    pub skipped: u64,
}

const IMAGE_FIELDS: [&str; 5] = ["jpg", "jpeg", "png", "webp", "img"];
const CLIP_FIELDS: [&str; 2] = ["mjpeg", "mjpg"];

/// Per-thread decoder and buffers, reused across samples.
struct Workspace {
    limits: (u64, u32),
    jpeg: JpegDecoder,
    region: Vec<u8>,
    oriented: Vec<u8>,
    tmp: Vec<u8>,
    resizer: Resizer,
}

thread_local! {
    static WORKSPACE: RefCell<Option<Workspace>> = const { RefCell::new(None) };
}

/// The decode/augment engine.
pub struct Engine {
    spec: PipelineSpec,
    /// The label's source and the fields sent beside each tensor.
    fields: FieldSpec,
    config: EngineConfig,
    /// Shared by every job of a worker, so they divide the cores between them.
    pool: Arc<rayon::ThreadPool>,
    times: Arc<StageTimes>,
    /// Output tensors the transport is done with, written again (see [`Engine::recycle`]).
    outputs: Arc<sluice_wire::BufferPool>,
    /// The job's part in the worker's sweeps ([`crate::share`]); `None`: it decodes alone.
    share: Option<crate::share::Sharing>,
    /// Where a unit's samples go once processed, for their source to read into again.
    spares: Option<Arc<sluice_shard::Spares>>,
}

/// Spare output tensors an engine keeps per size: about what is in flight between the
/// decoders and the transport (queues, credits, QUIC's send buffer).
pub(crate) const SPARE_OUTPUTS: usize = 512;

/// How often a unit waiting for its turn looks again (its turn's resume wakes it sooner).
const TURN_POLL: Duration = Duration::from_millis(50);

impl Engine {
    /// An engine with its own pool of `config.threads` threads.
    pub fn new(spec: PipelineSpec, config: EngineConfig) -> Result<Self, EngineError> {
        let pool = Self::pool(config.threads)?;
        Ok(Self::with_pool(spec, config, pool))
    }

    /// A decode pool (`threads` 0 = one per core) that several engines can share.
    pub fn pool(threads: usize) -> Result<Arc<rayon::ThreadPool>, EngineError> {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sluice-decode-{i}"))
            .build()
            .map(Arc::new)
            .map_err(|e| EngineError::Pool(e.to_string()))
    }

    /// An engine that runs on a shared pool (`config.threads` is ignored).
    pub fn with_pool(
        spec: PipelineSpec,
        config: EngineConfig,
        pool: Arc<rayon::ThreadPool>,
    ) -> Self {
        Engine {
            spec,
            fields: FieldSpec::default(),
            config,
            pool,
            times: Arc::new(StageTimes::default()),
            outputs: Arc::new(sluice_wire::BufferPool::new(SPARE_OUTPUTS)),
            share: None,
            spares: None,
        }
    }

    /// The same engine writing its tensors into buffers from `outputs`, a pool several
    /// engines share (a worker's jobs: an epoch's job then starts with the buffers the
    /// last one gave back, not fresh pages).
    pub fn with_outputs(mut self, outputs: Arc<sluice_wire::BufferPool>) -> Self {
        self.outputs = outputs;
        self
    }

    /// The same engine giving each sample of a unit back to `spares` once it is processed
    /// (the spares its source reads fields into: [`crate::ShardSource::spares`]).
    pub fn with_spares(mut self, spares: Arc<sluice_shard::Spares>) -> Self {
        self.spares = Some(spares);
        self
    }

    /// The same engine serving tensors other jobs of its sweep decoded, and keeping its own
    /// for them ([`crate::share`]).
    pub(crate) fn with_sharing(mut self, share: crate::share::Sharing) -> Self {
        self.share = Some(share);
        self
    }

    /// The same engine reading labels and fields as `fields` says (default: the `cls` label,
    /// no fields).
    pub fn with_fields(mut self, fields: FieldSpec) -> Self {
        self.fields = fields;
        self
    }

    /// Gives back an output tensor's memory once its bytes have been sent or copied, so
    /// later samples are written into it rather than into fresh pages.
    pub fn recycle(&self, tensor: Vec<u8>) {
        self.outputs.give_back(tensor);
    }

    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    pub fn times(&self) -> &StageTimes {
        &self.times
    }

    /// Processes one sample on the calling thread.
    pub fn process(&self, sample: &Sample, ctx: &SampleContext) -> Outcome {
        self.process_to(sample, ctx, None, None)
    }

    /// Processes one sample, its tensor written into its place in the client's batch when
    /// `target` has one for it (`key`: its key in the sweep's window, when the unit's thread
    /// made it already).
    fn process_to(
        &self,
        sample: &Sample,
        ctx: &SampleContext,
        target: Option<&PlaceTarget>,
        key: Option<u128>,
    ) -> Outcome {
        let started = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| {
            WORKSPACE.with(|cell| {
                let mut slot = cell.borrow_mut();
                let limits = (
                    self.config.limits.max_pixels,
                    self.config.limits.max_progressive_scans,
                );
                if slot.as_ref().is_none_or(|ws| ws.limits != limits) {
                    *slot = Some(Workspace {
                        limits,
                        jpeg: JpegDecoder::new(self.config.limits)?,
                        region: Vec::new(),
                        oriented: Vec::new(),
                        tmp: Vec::new(),
                        resizer: Resizer::new(),
                    });
                }
                let ws = slot
                    .as_mut()
                    .ok_or_else(|| DecodeError::Decoder("no workspace".into()))?;
                self.render(ws, sample, ctx, target.map(|t| (t, sample.index)), key)
            })
        }));
        let result = result.unwrap_or_else(|panic| {
            // A panicking decoder may leave the thread's workspace half-updated: drop it.
            WORKSPACE.with(|cell| cell.replace(None));
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(DecodeError::Panic(msg))
        });
        metrics::histogram!("sluice_cpu_sample_seconds").record(started.elapsed().as_secs_f64());
        match result {
            Ok(p) => {
                self.times.samples.fetch_add(1, Ordering::Relaxed);
                Outcome::Done(p)
            }
            Err(reason) => self.skipped(SampleError {
                shard: sample.shard.to_string(),
                key: sample.key.clone(),
                index: sample.index,
                reason,
            }),
        }
    }

    /// The sample copied out of the sweep's window on the calling thread, when another job
    /// of its sweep decoded it already ([`crate::share::Sharing::peek`]); otherwise its key
    /// (when one was made), for the pool's task. A sample whose label or fields are bad
    /// goes to the pool too, whose task reports it.
    pub(crate) fn served_here(
        &self,
        sample: &Sample,
        ctx: &SampleContext,
        target: Option<&PlaceTarget>,
    ) -> Result<Outcome, Option<u128>> {
        let Some(share) = &self.share else {
            return Err(None);
        };
        let started = Instant::now();
        let served = catch_unwind(AssertUnwindSafe(|| {
            let (image_field, data) = self.image_field(sample).map_err(|_| None)?;
            let kept = match share.peek(ctx.shard, sample, data) {
                crate::share::Peek::Ready(kept) => kept,
                crate::share::Peek::NotYet(key) => return Err(key),
            };
            let own = self.own_parts(sample, image_field).map_err(|_| None)?;
            Ok(self.hit(sample, ctx, own, &kept, target.map(|t| (t, sample.index))))
        }))
        .unwrap_or(Err(None))?;
        metrics::histogram!("sluice_cpu_sample_seconds").record(started.elapsed().as_secs_f64());
        self.times.samples.fetch_add(1, Ordering::Relaxed);
        Ok(Outcome::Done(served))
    }

    /// What a sample carries beside its tensor, from this job's read of it: its label,
    /// the fields the job asked for, and (when one is missing) the names it has.
    fn own_parts(&self, sample: &Sample, image_field: &str) -> Result<OwnParts, DecodeError> {
        Ok((
            self.fields.label(sample)?,
            self.fields.pick(sample, image_field)?,
            self.fields.names_if_missing(sample, image_field),
        ))
    }

    /// A sample whose tensor `kept` another job of its sweep decoded: copied to `dest` (or
    /// a buffer), with this job's own label and fields.
    fn hit(
        &self,
        sample: &Sample,
        ctx: &SampleContext,
        (label, fields, has): OwnParts,
        kept: &crate::share::Kept,
        dest: Dest<'_>,
    ) -> Processed {
        metrics::counter!("sluice_cpu_share_hits_total").increment(1);
        Processed {
            shard: ctx.shard,
            index: sample.index,
            key: sample.key.clone(),
            label,
            tensor: self.copied(&kept.tensor, dest),
            fields,
            geometry: kept.geometry,
            has,
            shared: true,
        }
    }

    /// The group its units read with ([`crate::share::Sharing::reads_together`]); `None`:
    /// they read on their own.
    pub(crate) fn read_group(&self) -> Option<u128> {
        self.share.as_ref()?.reads_together()
    }

    /// A sample that yields no tensor (the decoder rejected it, or storage damaged it),
    /// counted once.
    fn skipped(&self, error: SampleError) -> Outcome {
        self.times.skipped.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("sluice_cpu_samples_skipped_total").increment(1);
        Outcome::Skipped(error)
    }

    /// Processes samples already in memory on the pool; outcomes in input order.
    pub fn process_all(&self, samples: &[Sample], ctx: &SampleContext) -> Vec<Outcome> {
        use rayon::iter::{IntoParallelRefIterator, ParallelIterator as _};
        self.pool
            .install(|| samples.par_iter().map(|s| self.process(s, ctx)).collect())
    }

    /// Runs a work unit: samples stream in from `samples` (read and parsed on their own
    /// thread, so decoding starts on the first sample while the rest still arrives), are
    /// processed on the pool, and their outcomes are handed to `sink` on the calling thread in
    /// completion order. `sink` returns `false` to cancel. Every queue is bounded by
    /// `readahead`, so a slow sink slows the reader.
    pub fn run_unit<I, S>(
        &self,
        samples: I,
        ctx: SampleContext,
        sink: impl FnMut(Outcome) -> bool,
    ) -> Result<UnitStats, EngineError>
    where
        I: Iterator<Item = Result<S, ShardError>> + Send,
        S: Into<Arc<Sample>>,
    {
        self.run_unit_to(samples, ctx, None, None, sink)
    }

    /// [`Engine::run_unit`], each tensor written straight into its place in the client's
    /// batch when `target` has one for it (an [`Outcome::Done`] whose tensor says `placed`),
    /// and, given the unit's `turn`, samples decoded only on its turn.
    ///
    /// Samples are parsed up to `readahead` ahead on a thread of their own; the calling
    /// thread hands each to the pool as a task of its own, at most `readahead` (with a
    /// `turn`, a pool's worth) decoded or decoding and not yet taken by `sink`, and hands the
    /// outcomes to `sink` as they come ([`unit`]). So the pool's threads never wait, for
    /// input or to hand an outcome over, and several units share the pool sample by sample.
    /// With a `turn`, nothing is fed while the unit waits for its decode slot: the slots are
    /// shared among jobs by weight, and a unit that decoded ahead while it waited took the
    /// pool from the jobs whose turn it was (weights 3:1 gave 0.64 : 0.36 of one thread's
    /// samples, `bench/fair_share.sh`).
    pub fn run_unit_to<I, S>(
        &self,
        samples: I,
        ctx: SampleContext,
        target: Option<PlaceTarget>,
        turn: Option<&sluice_wire::Turn>,
        sink: impl FnMut(Outcome) -> bool,
    ) -> Result<UnitStats, EngineError>
    where
        I: Iterator<Item = Result<S, ShardError>> + Send,
        S: Into<Arc<Sample>>,
    {
        self.run_unit_on_hub(samples, &ctx, target.as_ref(), turn, sink)
    }

    fn render(
        &self,
        ws: &mut Workspace,
        sample: &Sample,
        ctx: &SampleContext,
        dest: Dest<'_>,
        key: Option<u128>,
    ) -> Result<Processed, DecodeError> {
        let (image_field, data) = self.image_field(sample)?;
        // Before decoding: a sample that cannot carry its label or fields costs no decode.
        let own = self.own_parts(sample, image_field)?;
        let mut claim = None;
        if let Some(share) = &self.share {
            match share.lookup(ctx.shard, sample, data, key) {
                crate::share::Lookup::Hit(kept) => {
                    return Ok(self.hit(sample, ctx, own, &kept, dest));
                }
                crate::share::Lookup::Decode(c) => claim = Some(c),
                crate::share::Lookup::Alone => {}
            }
        }
        // A decode kept for the sweep is made in a buffer of ours, then copied to its place.
        let (dest, place) = match claim.is_some() {
            true => (None, dest),
            false => (dest, None),
        };
        let mut rng = sample_stream(ctx.seed, ctx.epoch, ctx.shard, sample.index);
        let t0 = Instant::now();
        let (tensor, decode_ns, geometry) = if let Some(clip) = self.spec.clip {
            self.render_clip(ws, data, clip, &mut rng, dest)?
        } else if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
            self.render_jpeg(ws, data, &mut rng, t0, dest)?
        } else {
            let img = self.decode_other(data)?;
            let (w, h) = (img.width(), img.height());
            ws.oriented = img.into_raw();
            let (g, plan) = self.geometry(w, h, &mut rng);
            let decode_ns = t0.elapsed().as_nanos() as u64;
            let buf = std::mem::take(&mut ws.oriented);
            let t = self.resample(ws, (&buf, w, h), g.src, (&g, &plan), dest);
            ws.oriented = buf;
            (t?, decode_ns, self.reported(w, h, &g, &plan))
        };
        let total = t0.elapsed().as_nanos() as u64;
        self.times.decode_ns.fetch_add(decode_ns, Ordering::Relaxed);
        self.times
            .transform_ns
            .fetch_add(total - decode_ns, Ordering::Relaxed);
        metrics::histogram!("sluice_cpu_decode_seconds").record(decode_ns as f64 * 1e-9);
        metrics::histogram!("sluice_cpu_transform_seconds")
            .record((total - decode_ns) as f64 * 1e-9);
        let tensor = match claim {
            Some(claim) => {
                claim.keep(&tensor, &geometry);
                match self.to_place(&tensor, place) {
                    Some(placed) => {
                        self.outputs.give_back(tensor.data);
                        placed
                    }
                    None => tensor,
                }
            }
            None => tensor,
        };
        let (label, fields, has) = own;
        Ok(Processed {
            shard: ctx.shard,
            index: sample.index,
            key: sample.key.clone(),
            label,
            tensor,
            fields,
            geometry,
            has,
            shared: false,
        })
    }

    fn image_field<'s>(&self, sample: &'s Sample) -> Result<(&'s str, &'s [u8]), DecodeError> {
        let defaults: &[&str] = match self.spec.clip {
            Some(_) => &CLIP_FIELDS,
            None => &IMAGE_FIELDS,
        };
        let found = match &self.spec.field {
            Some(name) => sample.fields.iter().find(|f| &f.name == name),
            None => defaults
                .iter()
                .find_map(|n| sample.fields.iter().find(|f| f.name == *n)),
        };
        found
            .map(|f| (f.name.as_str(), f.data.as_slice()))
            .ok_or_else(|| DecodeError::NoImage {
                wanted: self
                    .spec
                    .field
                    .clone()
                    .unwrap_or_else(|| defaults.join("/")),
                present: sample
                    .fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}
