//! A CPU worker as the wire protocol sees it ([`sluice_wire::UnitRunner`]): jobs share one
//! decode pool and one shard source; an assignment streams its sample range from the source
//! through the engine, and each outcome becomes a wire output. The QUIC daemon serves this to
//! remote clients; a client can also run it in-process. A shard that is damaged (cut short,
//! a broken header) ends its unit with the samples it could not yield reported as skipped,
//! each named, rather than as a unit failure that every retry would repeat.

use std::sync::Arc;

use sluice_shard::{Checksum, Compression, ShardInfo};
use sluice_wire::spec::{PipelineSpec, SpecError};
use sluice_wire::{
    Assign, Finished, JobRunner, JobSpec, Output, Places, RunnerError, SampleHeader, SamplePayload,
    SampleShape, SkippedSample, Turn, UnitRunner,
};

use crate::engine::{
    BadSamplePolicy, Engine, EngineConfig, Outcome, PlaceTarget, Processed, SampleContext,
    UnitStats,
};
use crate::error::EngineError;
use crate::fields::FieldSpec;
use crate::source::{ShardLocation, ShardSource, SharedSamples};

/// The decode pool and shard source every job of a worker shares.
pub struct CpuWorker {
    pool: Arc<rayon::ThreadPool>,
    source: Arc<ShardSource>,
    config: EngineConfig,
    /// The largest sample payload (tensor and fields) a frame carries.
    max_sample_bytes: u64,
    /// Output tensors given back by every job's transport, for any job's next ones.
    outputs: Arc<sluice_wire::BufferPool>,
    /// The window of decodes its jobs' sweeps share, and whose jobs may share them.
    share: Option<(Arc<crate::share::Window>, Arc<crate::share::Scopes>)>,
}

impl CpuWorker {
    /// A worker with a pool of `config.threads` threads (0 = one per core).
    pub fn new(config: EngineConfig, source: ShardSource) -> Result<Self, EngineError> {
        Ok(CpuWorker {
            pool: Engine::pool(config.threads)?,
            source: Arc::new(source),
            config,
            max_sample_bytes: u64::from(sluice_wire::Limits::default().max_payload),
            outputs: Arc::new(sluice_wire::BufferPool::new(crate::engine::SPARE_OUTPUTS)),
            share: None,
        })
    }

    /// The largest payload (tensor and fields) one frame may carry: the daemon's
    /// `limits.max_payload_bytes` (256 MiB by default, what clients accept). A pipeline whose
    /// tensor is larger is refused when its job opens; a sample whose fields make it larger
    /// is skipped by name.
    pub fn with_max_sample_bytes(mut self, bytes: u64) -> Self {
        self.max_sample_bytes = bytes;
        self
    }

    /// Jobs that share (`JobSpec::share`) are served tensors `window` holds for their sweep
    /// and keep theirs there, among the jobs `scopes` puts together ([`crate::share`]).
    pub fn with_sharing(
        mut self,
        window: Arc<crate::share::Window>,
        scopes: Arc<crate::share::Scopes>,
    ) -> Self {
        self.share = Some((window, scopes));
        self
    }
}

impl UnitRunner for CpuWorker {
    fn open_job(&self, spec: &JobSpec) -> Result<Box<dyn JobRunner>, RunnerError> {
        let pipeline: PipelineSpec = spec
            .pipeline
            .parse()
            .map_err(|e: SpecError| RunnerError::Refused(e.into()))?;
        let shape = pipeline
            .shape_within(self.max_sample_bytes)
            .map_err(|e| RunnerError::Refused(e.into()))?;
        let config = EngineConfig {
            policy: if spec.fail_on_bad_sample {
                BadSamplePolicy::Fail
            } else {
                BadSamplePolicy::Skip
            },
            ..self.config.clone()
        };
        let fields = FieldSpec {
            fields: spec.fields.clone(),
            label: spec.label.clone(),
            max_field_bytes: spec.max_field_bytes,
        };
        let share = match (&self.share, spec.share) {
            (Some((window, scopes)), true) => Some(crate::share::Sharing::join(
                window,
                &scopes.of(&spec.name),
                &format!("{pipeline:?}"),
                [
                    spec.seed,
                    spec.epoch,
                    u64::from(spec.rank),
                    u64::from(spec.world_size),
                ],
            )),
            _ => None,
        };
        let mut engine = Engine::with_pool(pipeline, config, self.pool.clone())
            .with_fields(fields)
            .with_outputs(self.outputs.clone())
            .with_spares(self.source.spares().clone());
        if let Some(share) = share {
            engine = engine.with_sharing(share);
        }
        Ok(Box::new(CpuJob {
            engine,
            source: self.source.clone(),
            spec: spec.clone(),
            shape,
            max_sample_bytes: self.max_sample_bytes,
            places: std::sync::OnceLock::new(),
        }))
    }

    fn threads(&self) -> u32 {
        self.pool.current_num_threads() as u32
    }

    fn caches(&self) -> bool {
        self.source.caches()
    }
}

struct CpuJob {
    engine: Engine,
    source: Arc<ShardSource>,
    spec: JobSpec,
    shape: SampleShape,
    max_sample_bytes: u64,
    /// The client's batches, when it shares them: samples are resized straight into their
    /// places there.
    places: std::sync::OnceLock<Arc<dyn Places>>,
}

impl JobRunner for CpuJob {
    fn share_places(&self, places: Arc<dyn Places>) {
        let _ = self.places.set(places);
    }

    fn shape(&self) -> SampleShape {
        self.shape
    }

    fn recycle(&self, mut payload: Vec<u8>) {
        // The fields ride after the tensor; the engine reuses the tensor's length.
        payload.truncate(self.shape.bytes() as usize);
        self.engine.recycle(payload);
    }

    fn run(
        &self,
        assign: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
    ) -> Result<Finished, RunnerError> {
        self.run_paced(assign, emit, &Turn::default())
    }

    fn run_paced(
        &self,
        assign: &Assign,
        emit: &mut dyn FnMut(Output) -> bool,
        turn: &Turn,
    ) -> Result<Finished, RunnerError> {
        let loc = location(assign);
        let (source, range) = (&self.source, (assign.start, assign.end));
        let samples: SharedSamples = match self.engine.read_group() {
            Some(group) => source.open_unit_together(&loc, range.0, range.1, group),
            None => (source.open_unit_with_repair(&loc, range.0, range.1))
                .map(|own| Box::new(own.map(|s| s.map(Arc::new))) as SharedSamples),
        }
        .map_err(|e| RunnerError::Source(e.into()))?;
        let ctx = SampleContext {
            seed: self.spec.seed,
            epoch: self.spec.epoch,
            shard: assign.shard.index,
        };
        let mut finished = Finished::default();
        let mut stopped = None;
        // Which samples of the range were reported, so a damaged shard's unreadable rest can
        // be reported as skipped instead of failing the unit again and again.
        let mut reported = vec![false; (assign.end - assign.start) as usize];
        let target = self.places.get().map(|places| PlaceTarget {
            places: places.clone(),
            unit: assign.unit,
            attempt: assign.attempt,
        });
        let result = self
            .engine
            .run_unit_to(samples, ctx, target, Some(turn), |outcome| {
                let index = match &outcome {
                    Outcome::Done(p) => p.index,
                    Outcome::Skipped(e) => e.index,
                };
                if let Some(r) = index
                    .checked_sub(assign.start)
                    .and_then(|i| reported.get_mut(i as usize))
                {
                    *r = true;
                }
                let output = match outcome {
                    Outcome::Done(p) => match self.output(assign, &loc, p, &mut finished) {
                        Ok(output) => output,
                        Err(e) => {
                            stopped = Some(e);
                            return false;
                        }
                    },
                    Outcome::Skipped(e) => {
                        finished.skipped += 1;
                        skip(assign, e.index, e.key.clone(), e.reason.to_string())
                    }
                };
                let go = emit(output);
                if !go {
                    stopped = Some(RunnerError::Cancelled);
                }
                go
            });
        if let Some(e) = stopped {
            return Err(e);
        }
        if let Some(why) = self.damage(result, assign, &loc)? {
            self.skip_unread(assign, &reported, &why, emit, &mut finished)?;
        }
        (finished.storage_bytes, finished.cached_bytes) = loc.tally.get();
        Ok(finished)
    }
}

impl CpuJob {
    /// What a decoded sample becomes on the wire: the sample (in its frame, or in its place
    /// with the fields in the frame), or a named skip when it would not fit a frame; an
    /// error when it came out at another size than the job's (the unit is broken).
    fn output(
        &self,
        assign: &Assign,
        loc: &ShardLocation,
        p: Processed,
        finished: &mut Finished,
    ) -> Result<Output, RunnerError> {
        let expected = self.shape.bytes();
        // A tensor written into its place was claimed at the job's size.
        if p.tensor.placed.is_none() && p.tensor.data.len() as u64 != expected {
            return Err(RunnerError::Broken(format!(
                "sample {:?} of shard {} came out {}x{} ({} bytes), not the job's {}x{} \
                 ({expected} bytes)",
                p.key,
                loc.name(),
                p.tensor.width,
                p.tensor.height,
                p.tensor.data.len(),
                self.shape.width,
                self.shape.height
            )));
        }
        let with_fields = p
            .fields
            .iter()
            .fold(expected, |n, f| n.saturating_add(f.data.len() as u64));
        if with_fields > self.max_sample_bytes {
            // It could never be sent: skipped by name, not a frame that the transport
            // refuses and the client waits for forever.
            finished.skipped += 1;
            metrics::counter!("sluice_cpu_samples_skipped_total").increment(1);
            let reason = format!(
                "the sample is {with_fields} bytes with its fields, over the largest frame \
                 ({} bytes): ask for fewer fields, or lower max_field_bytes (a sluice cpu \
                 worker's own ceiling is its limits.max_payload_bytes)",
                self.max_sample_bytes
            );
            self.engine.recycle(p.tensor.data);
            return Ok(skip(assign, p.index, p.key, reason));
        }
        let (payload, fields) = SamplePayload::join(
            p.tensor.data,
            p.fields
                .iter()
                .map(|f| (f.name.as_str(), f.data.as_slice())),
        );
        let header = SampleHeader {
            job: assign.job,
            unit: assign.unit,
            attempt: assign.attempt,
            shard: assign.shard.index,
            index: p.index,
            key: p.key,
            label: p.label,
            tensor_bytes: expected,
            fields,
            geometry: p.geometry,
            has: p.has,
        };
        finished.sent += 1;
        let output = match p.tensor.placed {
            // The payload is the fields alone: the tensor is in its place.
            Some(place) => {
                metrics::counter!("sluice_cpu_resized_in_place_total").increment(1);
                Output::Placed(header, place, payload)
            }
            None => Output::Sample(header, payload),
        };
        Ok(match p.shared {
            true => Output::Shared(Box::new(output)),
            false => output,
        })
    }

    /// How the engine's run of a unit ended: `Some(why)` when the shard itself is damaged
    /// (its structure, or it ends early), which reading it again cannot help, so the samples
    /// it could not yield are reported skipped; an error for a read that failed (the network,
    /// a disk error), which fails the unit for the client to try elsewhere.
    fn damage(
        &self,
        result: Result<UnitStats, EngineError>,
        assign: &Assign,
        loc: &ShardLocation,
    ) -> Result<Option<String>, RunnerError> {
        let why = match result {
            Ok(stats) => {
                let (got, planned) = (stats.done + stats.skipped, assign.end - assign.start);
                (got != planned).then(|| {
                    format!(
                        "shard {} ended after {got} of samples {}..{}, which the manifest \
                         lists: it was cut short or changed since it was indexed",
                        loc.name(),
                        assign.start,
                        assign.end
                    )
                })
            }
            Err(EngineError::Shard(e)) if e.is_damage() && !self.spec.fail_on_bad_sample => {
                Some(e.to_string())
            }
            Err(EngineError::Shard(e)) => return Err(RunnerError::Source(e.into())),
            Err(EngineError::Source(e)) => return Err(RunnerError::Source(e.into())),
            Err(EngineError::BadSample(e)) => return Err(RunnerError::Damaged(e.to_string())),
            Err(e @ EngineError::Pool(_)) => return Err(RunnerError::Broken(e.to_string())),
        };
        match why {
            Some(why) if self.spec.fail_on_bad_sample => {
                Err(RunnerError::Damaged(format!("shard {}: {why}", loc.name())))
            }
            why => Ok(why),
        }
    }

    /// Reports each sample of the unit that a damaged shard did not yield as skipped, named.
    fn skip_unread(
        &self,
        assign: &Assign,
        reported: &[bool],
        why: &str,
        emit: &mut dyn FnMut(Output) -> bool,
        finished: &mut Finished,
    ) -> Result<(), RunnerError> {
        for (i, _) in reported.iter().enumerate().filter(|(_, r)| !**r) {
            let index = assign.start + i as u64;
            finished.skipped += 1;
            metrics::counter!("sluice_cpu_samples_skipped_total").increment(1);
            let reason = format!("unreadable: {why}");
            if !emit(skip(assign, index, format!("#{index}"), reason)) {
                return Err(RunnerError::Cancelled);
            }
        }
        Ok(())
    }
}

/// Where a unit's shard is: its replicas, a later attempt (a hedge beside a slow first one,
/// or a retry) starting from another one, so a slow replica does not hold up every copy of
/// the unit.
fn location(assign: &Assign) -> ShardLocation {
    let shard = &assign.shard;
    let mut urls = shard.urls.clone();
    if !urls.is_empty() {
        let turn = assign.attempt as usize % urls.len();
        urls.rotate_left(turn);
    }
    ShardLocation {
        tally: Default::default(),
        urls,
        info: ShardInfo {
            url: shard.urls.first().cloned().unwrap_or_default(),
            size: shard.size,
            samples: shard.samples,
            checksum: Checksum(shard.checksum),
            compression: if shard.gzip {
                Compression::Gzip
            } else {
                Compression::None
            },
            replicas: shard.urls.iter().skip(1).cloned().collect(),
        },
    }
}

/// The frame that reports sample `index` of `assign` skipped, by key and reason.
fn skip(assign: &Assign, index: u64, key: String, reason: String) -> Output {
    Output::Skipped(SkippedSample {
        job: assign.job,
        unit: assign.unit,
        attempt: assign.attempt,
        shard: assign.shard.index,
        index,
        key,
        reason,
    })
}
