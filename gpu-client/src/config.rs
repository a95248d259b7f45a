//! [`LoaderConfig`]: every setting of a loader, as plain data, validated once.
//!
//! [`crate::LoaderBuilder`] fills one in and validates it; the loader, each epoch's
//! coordinator and protocol ([`EpochSettings`]), the checkpoint and the Python binding all
//! read the same `Arc<LoaderConfig>`. It (de)serializes with the names the Python binding
//! passes (durations in seconds, the shuffle policy, fields and label as text), so the binding
//! hands over a dict and never restates the list.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sluice_plan::{BatchPlan, LastBatch, Mixing, PlanConfig, Remainder, ShufflePolicy};
use sluice_wire::{FieldSelection, LabelSource, Limits};

use crate::batch::ShortBatch;
use crate::error::ClientError;
use crate::same_host::SameHost;

/// The order samples fill batches in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The plan's order ([`sluice_plan::Sequence`]): batch `b` is the same list of samples
    /// for the same seed, whatever workers, transports, failures or resumes produced it.
    #[default]
    Plan,
    /// As samples arrive, through a seeded shuffle buffer: mixed, not reproducible; no
    /// sample waits for its turn.
    Arrival,
}

impl Order {
    /// Checkpoints written before the order was recorded were arrival order.
    pub(crate) fn legacy() -> Self {
        Order::Arrival
    }
}

impl std::fmt::Display for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Order::Plan => "plan",
            Order::Arrival => "arrival",
        })
    }
}

/// `FromStr` by a unit variant's serde name (`"plan"`, `"require"`), as configs and command
/// lines spell it.
macro_rules! from_serde_name {
    ($($t:ty),*) => {$(
        impl std::str::FromStr for $t {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                use serde::de::IntoDeserializer;
                <$t>::deserialize(s.into_deserializer())
                    .map_err(|e: serde::de::value::Error| format!("{s:?}: {e}"))
            }
        }
    )*};
}

from_serde_name!(Order, SameHost);

/// The labels a sample may carry into a batch (see [`LabelRange::check`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LabelRange {
    /// Negative labels are delivered (by default they are skipped: `cross_entropy` raises on
    /// them, and silently ignores -100).
    pub allow_negative: bool,
    /// Labels must be below this (`num_classes`), when given.
    pub num_classes: Option<u64>,
}

impl LabelRange {
    /// Why `label` cannot go into a batch, if it cannot.
    pub fn check(&self, label: i64) -> Option<String> {
        if label < 0 && !self.allow_negative {
            return Some(format!(
                "label: {label} is negative (a loss would crash on it or silently ignore it; \
                 allow_negative_labels=True delivers such labels)"
            ));
        }
        match self.num_classes {
            Some(n) if label >= 0 && label as u64 >= n => Some(format!(
                "label: {label} is out of range for num_classes={n}"
            )),
            _ => None,
        }
    }
}

/// Every setting of a loader but what is not data (the dataset's manifest, an in-process
/// decoder, the host allocator, a token given as text).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderConfig {
    /// A name for logs on the workers.
    pub dataset_name: String,
    /// `sluice cpu` daemons as `host:port` (a name may resolve to several, as a Kubernetes
    /// headless Service does); empty: decode in this process.
    pub workers: Vec<String>,
    /// A file of more workers, one `host:port` a line (`#` starts a comment), re-read while
    /// epochs run: a worker added to it gets units within `workers_refresh`, one removed from
    /// it is drained (its open units finish; nothing new goes to it). Names in it and in
    /// `workers` are re-resolved as often, so a DNS name's records (a headless Service's pods)
    /// come and go the same way.
    pub workers_file: Option<PathBuf>,
    /// How often the workers file is re-read and worker names re-resolved while an epoch runs.
    #[serde(with = "seconds")]
    pub workers_refresh: Duration,
    /// The pipeline spec, e.g. `decode | random_resized_crop 224 | hflip 0.5`.
    pub pipeline: String,
    pub batch_size: u32,
    pub seed: u64,
    pub rank: u32,
    pub world_size: u32,
    #[serde(with = "text")]
    pub shuffle: ShufflePolicy,
    /// What happens to samples that do not divide among ranks.
    pub remainder: Remainder,
    /// Largest work unit, in samples.
    pub max_unit_samples: u64,
    /// The order samples fill batches in (plan: reproducible; arrival: as they come).
    pub order: Order,
    /// The plan's mixing: units interleaved at once and the shuffle buffer after them
    /// (arrival order uses the buffer size for its shuffle buffer).
    pub mixing: Mixing,
    /// Plan order: how many positions ahead of the next one a unit may be started; bounds
    /// the samples held for their turn. 0: the larger of 512 and twice the batch size.
    pub lookahead: u64,
    /// Plan order: how long the next sample may be late before the rest of its unit is also
    /// given to another worker.
    #[serde(with = "seconds")]
    pub hedge_after: Duration,
    /// Which labels may reach a batch (default: non-negative ones, any size); a sample whose
    /// label is outside is a named skip, never a loss that crashes.
    pub labels: LabelRange,
    pub last_batch: LastBatch,
    pub short_batch: ShortBatch,
    /// Fail a unit (rather than skip the sample) when an image cannot be decoded.
    pub fail_on_bad_sample: bool,
    /// The non-image fields each batch carries beside its tensors (`[]`: none, `["all"]`).
    #[serde(with = "field_names")]
    pub fields: FieldSelection,
    /// Where each sample's integer label comes from (`cls`, `json:category_id`; `null`: no
    /// label, every label -1). A missing or non-integer label is a named skip.
    #[serde(with = "label_text")]
    pub label: LabelSource,
    /// A requested field (or the label's) longer than this makes its sample a named skip.
    pub max_field_bytes: u64,
    /// The cluster token's file (its first line), for remote workers.
    pub token_file: Option<PathBuf>,
    /// A PEM file with the workers' certificates (pinned) or their CA.
    pub trust_cert: Option<PathBuf>,
    /// Samples each worker may have in flight to this client.
    pub credits_per_worker: u32,
    pub receive_window: u64,
    /// Units each worker works on at once for this client.
    pub units_per_worker: usize,
    /// QUIC connections to each worker (1–16): one connection's packets are handled by one
    /// task on each side, about a core's worth. Same-host workers always get one.
    pub connections_per_worker: u32,
    /// Threads of the loader's runtime (1–16), which run its links and its coordinator:
    /// receiving, decrypting and copying samples into batches. One costs 10–15% less CPU per
    /// sample than two over QUIC (a third fewer wake-ups across threads, beside a real worker:
    /// `bench/host_cost_outside.sh`), and carries about 10,000 samples/s of 224×224×3 a rank
    /// over QUIC on a 2-core VM (`sluice bench host-cost`, `bench transport`), where two
    /// carried no more. 0 (the default): one, or `connections_per_worker` when that is above
    /// one, so added connections spread over threads ([`LoaderConfig::runtime_threads`]).
    pub io_threads: usize,
    /// Batch buffers in the ring (at least 2: one being filled, one being consumed).
    pub ring_batches: usize,
    /// How long to wait for any worker before an epoch fails.
    #[serde(with = "seconds")]
    pub worker_wait: Duration,
    /// How often the client says it is alive.
    #[serde(with = "seconds")]
    pub heartbeat: Duration,
    /// How long a worker may stay silent before its units move elsewhere.
    #[serde(with = "seconds")]
    pub silence: Duration,
    #[serde(with = "seconds")]
    pub connect_timeout: Duration,
    /// Failures of one unit before the epoch fails.
    pub max_unit_attempts: u32,
    pub client_name: String,
    /// Shared memory instead of QUIC for workers on this machine.
    pub same_host: SameHost,
    /// Where same-host workers' sockets are (`cpu-<port>.sock`).
    pub same_host_dir: PathBuf,
    /// The user same-host workers run as; unset: this process's own, or the owner of a
    /// socket directory only its owner can write. A socket owned by, or served by a process
    /// of, any other user but root is refused before anything is sent (QUIC takes over
    /// unless same-host is required).
    pub same_host_uid: Option<u32>,
    /// Start epoch `e + 1` while epoch `e` drains (see [`crate::LoaderBuilder`]).
    pub prefetch_next_epoch: bool,
    /// How many epochs the job reads (`0..epochs`), when known: the epoch after the last is
    /// then not started early.
    pub epochs: Option<u64>,
    /// A mixture's weights, one per source (see `sluice_plan::mixture`); `[]` with several
    /// sources: in proportion to their sizes. A checkpoint may be resumed with other weights.
    pub weights: Vec<f64>,
    /// A mixture's weights by training step, in place of `weights` (see
    /// `sluice_plan::schedule`): piecewise constant or linear between points, applied at
    /// batch boundaries, the same on every rank.
    pub weight_schedule: Option<sluice_plan::ScheduleSpec>,
    /// Samples in an epoch of a mixture (`None`: all its sources' samples).
    pub epoch_samples: Option<u64>,
    /// Samples each rank of a mixture plans at once (rounded down to whole batches): an
    /// epoch of more is read a round at a time, so its plan's memory (about 40 bytes a
    /// sample) and the time to its first batch do not grow with `epoch_samples` (see
    /// `sluice_plan::mixture`). Part of the plan: a checkpoint resumes only under the same.
    pub mixture_round_samples: u64,
    /// The training job's name on the workers: they share their decode slots among jobs by
    /// it and label its metrics with it. Every rank of a job should give the same (`None`:
    /// `dataset_name@client_name`, one job per host).
    pub job_name: Option<String>,
    /// The job's share of a busy worker against other jobs' (1: equal; a worker caps it at
    /// its `limits.max_job_weight`).
    pub job_weight: u32,
    /// Whether workers may serve this job tensors they decoded for another job of the same
    /// team reading the same samples with the same pipeline and seed (a sweep), and keep this
    /// job's for them: the pool decodes a sweep's samples once. Batches are the same either
    /// way; `false` makes every worker decode this job's samples for it alone.
    pub share: bool,
    /// Where batches go: `"cpu"` (host memory) or `"cuda"`/`"cuda:N"` (that GPU; the Python
    /// binding built with `cuda` uploads them).
    pub device: String,
    /// On the GPU, what each batch becomes: `"uint8"` (as the workers made it), `"float16"`
    /// or `"float32"`, normalized by `mean` and `std` (ImageNet's where unset).
    pub dtype: String,
    pub mean: Option<[f32; 3]>,
    pub std: Option<[f32; 3]>,
    /// Decode threads of the in-process worker (no `workers`); unset: 1.
    pub threads: Option<usize>,
    /// The most bytes a field's value may decode to in Python (`npy`, `npz`); unset:
    /// [`DECODED_PER_STORED`] times `max_field_bytes`.
    pub max_decoded_bytes: Option<u64>,
    /// A mixture's datasets, one per weight of `weights`, in the order `images.source`
    /// numbers them (`[]`: one dataset, or a mixture file's).
    pub sources: Vec<String>,
}

/// How many times its stored size a field's value may decode to by default (an `npz`
/// compresses well: 8x is far above real arrays, far below a zip bomb's ratio).
pub const DECODED_PER_STORED: u64 = 8;

/// A [`LoaderConfig`] that passed [`LoaderConfig::validate`]: a builder takes it as it is
/// (`LoaderBuilder::valid_config`), so a binding that reads settings before it builds the
/// loader validates them once.
#[derive(Clone, Debug)]
pub struct ValidConfig(LoaderConfig);

impl std::ops::Deref for ValidConfig {
    type Target = LoaderConfig;

    fn deref(&self) -> &LoaderConfig {
        &self.0
    }
}

impl ValidConfig {
    pub fn into_inner(self) -> LoaderConfig {
        self.0
    }
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            dataset_name: "dataset".into(),
            workers: Vec::new(),
            workers_file: None,
            workers_refresh: Duration::from_secs(1),
            device: "cpu".into(),
            dtype: "uint8".into(),
            mean: None,
            std: None,
            threads: None,
            max_decoded_bytes: None,
            sources: Vec::new(),
            pipeline: "decode | random_resized_crop 224 | hflip 0.5".into(),
            batch_size: 256,
            seed: 0,
            rank: 0,
            world_size: 1,
            shuffle: ShufflePolicy::Global,
            remainder: Remainder::Drop,
            max_unit_samples: 64,
            order: Order::Plan,
            mixing: Mixing::default(),
            lookahead: 0,
            hedge_after: Duration::from_secs(3),
            labels: LabelRange::default(),
            last_batch: LastBatch::Partial,
            short_batch: ShortBatch::Deliver,
            fail_on_bad_sample: false,
            fields: FieldSelection::None,
            label: LabelSource::default(),
            max_field_bytes: 1 << 20,
            token_file: None,
            trust_cert: None,
            credits_per_worker: 128,
            receive_window: 64 << 20,
            units_per_worker: 2,
            connections_per_worker: 1,
            io_threads: 0,
            ring_batches: 4,
            worker_wait: Duration::from_secs(30),
            heartbeat: Duration::from_secs(1),
            silence: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_unit_attempts: 5,
            client_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "client".into()),
            same_host: SameHost::Auto,
            same_host_dir: crate::same_host::default_socket_dir(),
            same_host_uid: None,
            prefetch_next_epoch: true,
            epochs: None,
            weights: Vec::new(),
            weight_schedule: None,
            epoch_samples: None,
            mixture_round_samples: sluice_plan::mixture::DEFAULT_ROUND_SAMPLES,
            job_name: None,
            job_weight: 1,
            share: true,
        }
    }
}

impl LoaderConfig {
    /// The job's name on the workers (see [`LoaderConfig::job_name`]). The default,
    /// `dataset@client`, keeps its last 128 characters (what a worker accepts): a long
    /// manifest path must not make every worker refuse a job its user never named.
    pub fn job_name(&self) -> String {
        self.job_name.clone().unwrap_or_else(|| {
            let name = format!("{}@{}", self.dataset_name, self.client_name);
            let name: String = name.chars().filter(|c| !c.is_control()).collect();
            let skip = name.chars().count().saturating_sub(128);
            name.chars().skip(skip).collect()
        })
    }

    /// Samples that can wait for their turn in plan order at most (the reorder bound, see
    /// `crate::reorder`): `lookahead + buffer_samples + window_units × max_unit_samples`.
    pub(crate) fn waiting_bound(&self) -> u64 {
        self.lookahead
            .saturating_add(u64::from(self.mixing.buffer_samples))
            .saturating_add(
                u64::from(self.mixing.window_units).saturating_mul(self.max_unit_samples),
            )
    }

    /// The loader runtime's threads: `io_threads`, or when it is 0, one, or as many as the
    /// QUIC connections to each worker when there are more. One thread receives, decrypts
    /// and copies a rank's samples with none of the wake-ups across threads a second adds
    /// (once about 10% of the client's CPU a sample over either transport); a rank that reads
    /// faster than one thread carries asks for more connections, or for threads.
    pub fn runtime_threads(&self) -> usize {
        match self.io_threads {
            0 => (self.connections_per_worker as usize).clamp(1, 16),
            given => given,
        }
    }

    /// Workers are `sluice cpu` daemons (a list, a workers file or both), not this process.
    pub fn remote(&self) -> bool {
        !self.workers.is_empty() || self.workers_file.is_some()
    }

    /// Checks every setting on its own and against the others, naming the key, and settles
    /// the defaults that follow from others (the lookahead, manifest order's mixing). The
    /// dataset and the world are checked against each other when the loader is built.
    pub fn validate(&mut self) -> Result<(), ClientError> {
        self.check_world()?;
        self.check_counts()?;
        self.check_device()?;
        self.check_sizes()?;
        self.settle_order()?;
        self.settle_clips()?;
        if self.order == Order::Plan && self.lookahead < u64::from(self.batch_size) {
            return bad(
                "lookahead",
                "must be at least batch_size, or workers could not fill one batch ahead",
            );
        }
        Ok(())
    }

    /// [`Self::validate`]d, as a value that says so.
    pub fn validated(mut self) -> Result<ValidConfig, ClientError> {
        self.validate()?;
        Ok(ValidConfig(self))
    }

    /// The GPU the batches go to (`None`: host memory), from a validated `device`.
    pub fn device_ordinal(&self) -> Option<usize> {
        parse_device(&self.device).ok().flatten()
    }

    /// Whether the batches are converted on the GPU (anything but uint8 as the workers made
    /// them).
    pub fn converts(&self) -> bool {
        self.dtype != "uint8" || self.mean.is_some() || self.std.is_some()
    }

    /// The most bytes a field's value may decode to.
    pub fn decoded_limit(&self) -> u64 {
        (self.max_decoded_bytes).unwrap_or(self.max_field_bytes.saturating_mul(DECODED_PER_STORED))
    }

    /// Where the batches go and what they become there; the in-process threads, the decode
    /// limit, a mixture's datasets against its weights.
    fn check_device(&self) -> Result<(), ClientError> {
        let ordinal = parse_device(&self.device).or_else(|d| bad("device", &d))?;
        if !["uint8", "float16", "float32"].contains(&self.dtype.as_str()) {
            let detail = format!(
                "expected \"uint8\", \"float16\" or \"float32\", got {:?}",
                self.dtype
            );
            return bad("dtype", &detail);
        }
        if ordinal.is_none() && self.converts() {
            let detail = format!(
                "{:?} / mean / std: the conversion runs on the GPU, so it needs \
                 device=\"cuda:N\" (on the CPU, convert the uint8 batch yourself)",
                self.dtype
            );
            return bad("dtype", &detail);
        }
        if let Some(s) = self
            .std
            .iter()
            .flatten()
            .find(|s| !(s.is_finite() && **s > 0.0))
        {
            return bad("std", &format!("every value must be positive, got {s}"));
        }
        if self.threads == Some(0) {
            return bad("threads", "must be at least 1");
        }
        if self.max_decoded_bytes == Some(0) {
            return bad("max_decoded_bytes", "must be at least 1");
        }
        if !self.sources.is_empty() && self.sources.len() != self.weights.len() {
            let detail = format!(
                "{} sources for {} weights",
                self.sources.len(),
                self.weights.len()
            );
            return bad("sources", &detail);
        }
        Ok(())
    }

    /// The batch, the rank in its world, and the workers: where they are and how to trust
    /// them.
    fn check_world(&self) -> Result<(), ClientError> {
        if self.batch_size == 0 {
            return bad("batch_size", "must be at least 1");
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            let detail = format!(
                "rank {} is outside world_size {}",
                self.rank, self.world_size
            );
            return bad("rank", &detail);
        }
        if self.workers_refresh < Duration::from_millis(10) {
            return bad("workers_refresh", "must be at least 0.01 s");
        }
        // A pool must start from a list: a workers file that cannot be read now is an error
        // (once an epoch has run, one that goes bad keeps the last good list).
        if let Some(file) = &self.workers_file {
            read_workers_file(file)?;
        }
        if self.remote() && self.trust_cert.is_none() {
            return bad(
                "trust_cert",
                "remote workers need a certificate to trust (a worker's state_dir/cert.pem, or their CA)",
            );
        }
        Ok(())
    }

    /// The counts and limits that must be at least 1 (or within a range), and the names.
    fn check_counts(&self) -> Result<(), ClientError> {
        if self.ring_batches < 2 {
            return bad("ring_batches", "must be at least 2");
        }
        if !(1..=16).contains(&self.connections_per_worker) {
            return bad("connections_per_worker", "must be 1 to 16");
        }
        if self.io_threads > 16 {
            return bad("io_threads", "must be 1 to 16 (0: chosen by the loader)");
        }
        if self.credits_per_worker == 0 || self.units_per_worker == 0 {
            return bad(
                "credits_per_worker",
                "credits and units per worker must be at least 1",
            );
        }
        if self.silence <= self.heartbeat * 2 {
            return bad("silence", "must exceed twice the heartbeat interval");
        }
        if self.max_unit_attempts == 0 {
            return bad("max_unit_attempts", "must be at least 1");
        }
        if self.mixing.window_units == 0 {
            return bad("mixing.window_units", "must be at least 1");
        }
        if self.max_field_bytes == 0 {
            return bad("max_field_bytes", "must be at least 1");
        }
        if self.labels.num_classes == Some(0) {
            return bad("num_classes", "must be at least 1");
        }
        if !self.weights.is_empty() {
            if let Err(e) = sluice_plan::mixture::scale_weights(&self.weights) {
                return bad("weights", &e.to_string());
            }
        }
        if self.job_weight == 0 {
            return bad("job_weight", "must be at least 1");
        }
        if let Some(name) = &self.job_name {
            if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
                return bad("job_name", "must be 1 to 128 printable characters");
            }
        }
        if self.epoch_samples == Some(0) {
            return bad("epoch_samples", "must be at least 1");
        }
        if self.mixture_round_samples == 0 {
            return bad("mixture_round_samples", "must be at least 1");
        }
        Ok(())
    }

    /// Manifest order's mixing (one unit at a time, no shuffle buffer), and the lookahead's
    /// default.
    fn settle_order(&mut self) -> Result<(), ClientError> {
        if !self.shuffle.shuffles() {
            // Manifest order: one unit at a time, no shuffle buffer, batches in plan order.
            if self.order == Order::Arrival {
                return bad(
                    "order",
                    "shuffle \"none\" delivers in manifest order, which needs order \"plan\"",
                );
            }
            self.mixing = Mixing {
                window_units: 1,
                buffer_samples: 0,
            };
        }
        if self.lookahead == 0 {
            self.lookahead = 512.max(2 * u64::from(self.batch_size));
        }
        Ok(())
    }

    /// The pipeline checked; a loader that does not shuffle takes each clip's middle frames,
    /// unless the pipeline says where clips start.
    fn settle_clips(&mut self) -> Result<(), ClientError> {
        let spec = check_pipeline(&self.pipeline)?;
        if let Some(clip) = spec.clip.filter(|c| !c.explicit_start) {
            if self.shuffle == ShufflePolicy::Sequential {
                let start = sluice_wire::spec::ClipStart::Center;
                let clip = sluice_wire::spec::Clip {
                    start,
                    explicit_start: true,
                    ..clip
                };
                let centred = sluice_wire::spec::PipelineSpec {
                    clip: Some(clip),
                    ..spec
                };
                self.pipeline = centred.to_string();
            }
        }
        Ok(())
    }

    /// Refuses, by name and with the limit, a size-like setting larger than the memory it
    /// would make the process allocate could be: each bound lies far above any useful value
    /// and below what aborts a process (an allocation failure, which Python cannot catch).
    fn check_sizes(&self) -> Result<(), ClientError> {
        let sizes: [(&'static str, u64, u64, &str); 10] = [
            ("batch_size", self.batch_size.into(), 1 << 20, "samples"),
            // A round's plan takes about 40 bytes a sample: 640 MiB a rank at the bound.
            (
                "mixture_round_samples",
                self.mixture_round_samples,
                1 << 24,
                "samples",
            ),
            ("lookahead", self.lookahead, 1 << 24, "samples"),
            (
                "mixing.buffer_samples",
                self.mixing.buffer_samples.into(),
                1 << 24,
                "samples",
            ),
            (
                "mixing.window_units",
                self.mixing.window_units.into(),
                1 << 16,
                "units",
            ),
            (
                "credits_per_worker",
                self.credits_per_worker.into(),
                1 << 20,
                "samples",
            ),
            (
                "units_per_worker",
                self.units_per_worker as u64,
                1 << 16,
                "units",
            ),
            ("ring_batches", self.ring_batches as u64, 1 << 12, "batches"),
            ("receive_window", self.receive_window, 1 << 34, "bytes"),
            ("max_field_bytes", self.max_field_bytes, 1 << 32, "bytes"),
        ];
        for (key, value, limit, unit) in sizes {
            if value > limit {
                return Err(ClientError::Config {
                    key,
                    detail: format!(
                        "{value} is more than this process should allocate for it: at most \
                         {limit} {unit}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// The job-wide inputs of this loader's plans.
    pub fn plan_config(&self) -> PlanConfig {
        PlanConfig {
            seed: self.seed,
            world_size: self.world_size,
            policy: self.shuffle,
            remainder: self.remainder,
            max_unit_samples: self.max_unit_samples,
        }
    }

    /// The plan settings a checkpoint records beside its named fields.
    pub fn plan_settings(&self) -> PlanSettings {
        PlanSettings {
            remainder: self.remainder,
            max_unit_samples: self.max_unit_samples,
            last_batch: self.last_batch,
            mixing: self.mixing,
            mixture_round_samples: self.mixture_round_samples,
        }
    }
}

/// `"cpu"` (`None`), `"cuda"` (0) or `"cuda:N"`; otherwise what is wrong.
fn parse_device(device: &str) -> Result<Option<usize>, String> {
    match device {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        d => d
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("expected \"cpu\", \"cuda\" or \"cuda:N\", got {d:?}")),
    }
}

/// A setting refused: `key`, and why.
fn bad<T>(key: &'static str, detail: &str) -> Result<T, ClientError> {
    Err(ClientError::Config {
        key,
        detail: detail.into(),
    })
}

/// The workers a workers file names: one `host:port` a line; blank lines and `#` comments
/// are ignored.
pub(crate) fn read_workers_file(path: &Path) -> Result<Vec<String>, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|e| ClientError::Config {
        key: "workers_file",
        detail: format!("{}: {e}", path.display()),
    })?;
    let mut names = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.split_whitespace().count() > 1 || !line.contains(':') {
            return Err(ClientError::Config {
                key: "workers_file",
                detail: format!(
                    "{} line {}: {line:?} is not one host:port",
                    path.display(),
                    n + 1
                ),
            });
        }
        names.push(line.to_string());
    }
    Ok(names)
}

/// Parses `pipeline` with the workers' grammar and checks that its tensors have a fixed
/// shape that fits the largest frame a worker sends: what every worker would refuse at job
/// open, as an error here instead of at the first batch. `LoaderBuilder::build` calls it; a
/// binding may call it earlier.
pub fn check_pipeline(pipeline: &str) -> Result<sluice_wire::spec::PipelineSpec, ClientError> {
    let bad = |detail: String| ClientError::Config {
        key: "pipeline",
        detail,
    };
    let spec: sluice_wire::spec::PipelineSpec = pipeline
        .parse()
        .map_err(|e: sluice_wire::spec::SpecError| bad(e.to_string()))?;
    spec.shape_within(u64::from(Limits::default().max_payload))
        .map_err(|e| bad(e.to_string()))?;
    Ok(spec)
}

/// The settings besides seed, shuffle, order and batch size that decide a rank's batches: a
/// checkpoint must have been taken with the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSettings {
    pub remainder: Remainder,
    pub max_unit_samples: u64,
    pub last_batch: LastBatch,
    pub mixing: Mixing,
    /// Checkpoints before it recorded none: the default then.
    #[serde(default = "default_round_samples")]
    pub mixture_round_samples: u64,
}

fn default_round_samples() -> u64 {
    sluice_plan::mixture::DEFAULT_ROUND_SAMPLES
}

impl PlanSettings {
    /// The text checkpoints of version 2 recorded for these settings.
    pub(crate) fn version2_text(&self) -> String {
        format!(
            "remainder={:?} unit={} last={:?} mix={}x{}",
            self.remainder,
            self.max_unit_samples,
            self.last_batch,
            self.mixing.window_units,
            self.mixing.buffer_samples
        )
    }

    /// Each setting as (name, value), in the order a difference is named.
    pub(crate) fn named(&self) -> Vec<(&'static str, String)> {
        vec![
            ("remainder", format!("{:?}", self.remainder)),
            ("max_unit_samples", self.max_unit_samples.to_string()),
            ("last_batch", format!("{:?}", self.last_batch)),
            ("mixing", format!("{:?}", self.mixing)),
            (
                "mixture_round_samples",
                self.mixture_round_samples.to_string(),
            ),
        ]
    }
}

/// What one epoch's coordinator and protocol run under: the loader's settings and where in
/// the epoch they start.
#[derive(Clone, Debug)]
pub(crate) struct EpochSettings {
    pub config: Arc<LoaderConfig>,
    pub job: u64,
    pub epoch: u64,
    pub batch_plan: BatchPlan,
    /// The first batch this run fills (past 0 when resumed).
    pub first_batch: u64,
}

/// Durations as seconds (a float), as Python passes them.
mod seconds {
    use super::*;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        if v.is_finite() && v > 0.0 && v < 1e6 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(serde::de::Error::custom(format!(
                "must be a positive number of seconds, got {v}"
            )))
        }
    }
}

/// A value as its text (`Display` and `FromStr`): `"global"`, `"partial:0.2"`.
mod text {
    use super::*;

    pub fn serialize<T: std::fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
        D: Deserializer<'de>,
    {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Fields as a list of names (`[]` none, `["all"]` every one).
mod field_names {
    use super::*;

    pub fn serialize<S: Serializer>(f: &FieldSelection, s: S) -> Result<S::Ok, S::Error> {
        let names: Vec<String> = match f {
            FieldSelection::None => Vec::new(),
            FieldSelection::Named(n) => n.clone(),
            FieldSelection::All => vec!["all".into()],
        };
        names.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FieldSelection, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        FieldSelection::from_names(&names).map_err(serde::de::Error::custom)
    }
}

/// The label's source as text (`"cls"`, `"json:category_id"`), or `null` for none.
mod label_text {
    use super::*;

    pub fn serialize<S: Serializer>(l: &LabelSource, s: S) -> Result<S::Ok, S::Error> {
        match l {
            LabelSource::None => s.serialize_none(),
            other => s.collect_str(other),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LabelSource, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(LabelSource::None),
            Some(text) => LabelSource::parse(&text).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests;
