//! The loader: the builder users configure, epochs as iterators of batches, and checkpoints.
//!
//! Each epoch computes this rank's plan (no coordinator: every rank does the same from the
//! manifest, seed, epoch and world size), opens a job on every worker (QUIC links, or the
//! engine in this process), and runs a [`Coordinator`] on the loader's own small tokio
//! runtime. The consumer's thread only waits on a bounded queue of finished batches; while
//! it holds them, their ring buffers stay out of the ring, which stops credits, which stops
//! the workers: memory stays bounded whatever the step time.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sluice_plan::{
    Mixing, PlanConfig, Remainder, Sequence, ShuffleBuffer, ShufflePolicy, WorkUnit,
};
use sluice_shard::Manifest;
use sluice_wire::{BufferPool, FieldSelection, JobSpec, LabelSource, Limits, UnitRunner};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::batch::{
    Batch, BatchPlan, HeapAllocator, HostAllocator, LastBatch, Recycling, ShortBatch,
};
use crate::coordinator::{handoff, Coordinator, Predecessor, Settings};
use crate::error::ClientError;
use crate::ledger::{Ledger, LedgerRecord, Verdict};
use crate::link::{run_local, RemoteLink, SameHostRoute};
use crate::reorder::Reorder;
use crate::same_host::SameHost;
use crate::stats::{EpochCounters, EpochReport, Stats, StatsSnapshot};

/// Where samples are decoded.
#[derive(Clone)]
pub enum Workers {
    /// `sluice cpu` daemons, as `host:port` (a name may resolve to several workers, as a
    /// Kubernetes headless Service does).
    Remote(Vec<String>),
    /// In this process, with no daemon (e.g. `sluice_cpu::CpuWorker`).
    InProcess(Arc<dyn UnitRunner>),
}

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
    fn legacy() -> Self {
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

impl std::str::FromStr for Order {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plan" => Ok(Order::Plan),
            "arrival" => Ok(Order::Arrival),
            _ => Err(format!("order {s:?} is not \"plan\" or \"arrival\"")),
        }
    }
}

/// Builds a [`Loader`]; every setting has a default but the dataset and the workers.
pub struct LoaderBuilder {
    manifest: Option<Manifest>,
    dataset_name: String,
    workers: Option<Workers>,
    pipeline: String,
    batch_size: u32,
    seed: u64,
    rank: u32,
    world_size: u32,
    shuffle: ShufflePolicy,
    remainder: Remainder,
    max_unit_samples: u64,
    order: Order,
    mixing: Mixing,
    lookahead: u64,
    hedge_after: Duration,
    labels: crate::protocol::LabelRange,
    last_batch: LastBatch,
    short_batch: ShortBatch,
    fail_on_bad_sample: bool,
    fields: FieldSelection,
    label: LabelSource,
    max_field_bytes: u64,
    token: Option<String>,
    trust_cert: Option<PathBuf>,
    credits_per_worker: u32,
    receive_window: u64,
    units_per_worker: usize,
    connections_per_worker: u32,
    ring_batches: usize,
    worker_wait: Duration,
    heartbeat: Duration,
    silence: Duration,
    connect_timeout: Duration,
    max_unit_attempts: u32,
    allocator: Arc<dyn HostAllocator>,
    client_name: String,
    same_host: SameHost,
    same_host_dir: PathBuf,
    prefetch_next_epoch: bool,
    epochs: Option<u64>,
}

impl Default for LoaderBuilder {
    fn default() -> Self {
        LoaderBuilder {
            manifest: None,
            dataset_name: "dataset".into(),
            workers: None,
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
            labels: Default::default(),
            last_batch: LastBatch::Partial,
            short_batch: ShortBatch::Deliver,
            fail_on_bad_sample: false,
            fields: FieldSelection::None,
            label: LabelSource::default(),
            max_field_bytes: 1 << 20,
            token: None,
            trust_cert: None,
            credits_per_worker: 128,
            receive_window: 64 << 20,
            units_per_worker: 2,
            connections_per_worker: 1,
            ring_batches: 4,
            worker_wait: Duration::from_secs(30),
            heartbeat: Duration::from_secs(1),
            silence: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            max_unit_attempts: 5,
            allocator: Arc::new(HeapAllocator),
            client_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "client".into()),
            same_host: SameHost::Auto,
            same_host_dir: crate::same_host::default_socket_dir(),
            prefetch_next_epoch: true,
            epochs: None,
        }
    }
}

macro_rules! setter {
    ($(#[$m:meta])* $name:ident: $t:ty) => {
        $(#[$m])*
        pub fn $name(mut self, $name: $t) -> Self {
            self.$name = $name;
            self
        }
    };
}

impl LoaderBuilder {
    /// The dataset's manifest (shard URLs must be absolute or resolvable by the workers).
    pub fn dataset(mut self, manifest: Manifest) -> Self {
        self.manifest = Some(manifest);
        self
    }

    /// Remote workers (`host:port`).
    pub fn workers<I, S>(mut self, workers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.workers = Some(Workers::Remote(
            workers.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// Decode in this process with `runner` (no daemons).
    pub fn in_process(mut self, runner: Arc<dyn UnitRunner>) -> Self {
        self.workers = Some(Workers::InProcess(runner));
        self
    }

    setter!(/// A name for logs on the workers.
        dataset_name: String);
    setter!(/// The pipeline spec, e.g. `decode | random_resized_crop 224 | hflip 0.5`.
        pipeline: String);
    setter!(batch_size: u32);
    setter!(seed: u64);
    setter!(rank: u32);
    setter!(world_size: u32);
    setter!(shuffle: ShufflePolicy);
    setter!(/// What happens to samples that do not divide among ranks.
        remainder: Remainder);
    setter!(/// Largest work unit, in samples.
        max_unit_samples: u64);
    setter!(/// The order samples fill batches in (plan: reproducible; arrival: as they come).
        order: Order);
    setter!(/// The plan's mixing: units interleaved at once and the shuffle buffer after them
        /// (arrival order uses the buffer size for its shuffle buffer).
        mixing: Mixing);
    setter!(/// Plan order: how many positions ahead of the next one a unit may be started;
        /// bounds the samples held for their turn (see ARCHITECTURE.md for the memory).
        /// 0 (the default): the larger of 512 and twice the batch size.
        lookahead: u64);
    setter!(/// Plan order: how long the next sample may be late before the rest of its unit is
        /// also given to another worker.
        hedge_after: Duration);
    setter!(/// Which labels may reach a batch (default: non-negative ones, any size); a
        /// sample whose label is outside is a named skip, never a loss that crashes.
        labels: crate::protocol::LabelRange);
    setter!(last_batch: LastBatch);
    setter!(short_batch: ShortBatch);
    setter!(/// Fail a unit (rather than skip the sample) when an image cannot be decoded.
        fail_on_bad_sample: bool);
    setter!(/// The non-image fields each batch carries beside its tensors (default none, so a
        /// classification job receives and pays for nothing more): only these travel.
        fields: FieldSelection);
    setter!(/// Where each sample's integer label comes from (default the `cls` field). A
        /// sample whose label field is missing or not an integer is a named skip;
        /// [`LabelSource::None`] is for unlabeled data (every label -1).
        label: LabelSource);
    setter!(/// A requested field (or the label's) longer than this makes its sample a named
        /// skip (default 1 MiB).
        max_field_bytes: u64);
    setter!(/// Samples each worker may have in flight to this client.
        credits_per_worker: u32);
    setter!(/// Units each worker works on at once for this client.
        units_per_worker: usize);
    setter!(/// QUIC connections to each worker (1–16). One connection's packets are handled
        /// by one task on each side, about a core's worth; a worker that decodes faster than
        /// that for one client needs more. Each is a link of its own, with its own credits
        /// and units. Same-host workers always get one.
        connections_per_worker: u32);
    setter!(/// Batch buffers in the ring (at least 2: one being filled, one being consumed).
        ring_batches: usize);
    setter!(/// How long to wait for any worker before an epoch fails.
        worker_wait: Duration);
    setter!(/// How often the client says it is alive.
        heartbeat: Duration);
    setter!(/// How long a worker may stay silent before its units move elsewhere.
        silence: Duration);
    setter!(connect_timeout: Duration);
    setter!(/// Failures of one unit before the epoch fails.
        max_unit_attempts: u32);
    setter!(/// Where batch buffers come from (page-locked memory for CUDA).
        allocator: Arc<dyn HostAllocator>);
    setter!(client_name: String);
    setter!(/// Shared memory instead of QUIC for workers on this machine.
        same_host: SameHost);
    setter!(/// Where same-host workers' sockets are (`cpu-<port>.sock`).
        same_host_dir: PathBuf);
    setter!(/// Start epoch `e + 1` while epoch `e` drains (default on): its first units go to
        /// the workers once `e` has handed out all of its own, and it fills its first batch
        /// from `e`'s ring once `e` has taken the buffer of its last. Off: each epoch starts
        /// when `epoch()` is called. Without [`LoaderBuilder::epochs`], the epoch after the
        /// last one the consumer reads is started too (up to a window of credits per worker
        /// decoded for nothing), and cancelled when the loader is dropped. A consumer that asks
        /// for the same epoch again (an evaluation loop) gets nothing started behind it.
        prefetch_next_epoch: bool);

    /// How many epochs the job reads (`0..epochs`), when known: the epoch after the last is
    /// then not started early.
    pub fn epochs(mut self, epochs: u64) -> Self {
        self.epochs = Some(epochs);
        self
    }

    /// The cluster token the workers expect.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A PEM file with the workers' certificates (pinned) or their CA.
    pub fn trust_cert(mut self, path: impl Into<PathBuf>) -> Self {
        self.trust_cert = Some(path.into());
        self
    }

    pub fn build(mut self) -> Result<Loader, ClientError> {
        let bad = |key, detail: &str| {
            Err(ClientError::Config {
                key,
                detail: detail.into(),
            })
        };
        let Some(manifest) = self.manifest.clone() else {
            return bad("dataset", "no dataset given");
        };
        let Some(workers) = self.workers.clone() else {
            return bad(
                "workers",
                "give remote workers or choose in-process decoding",
            );
        };
        if let Workers::Remote(w) = &workers {
            if w.is_empty() {
                return bad("workers", "the list is empty");
            }
            if self.trust_cert.is_none() {
                return bad(
                    "trust_cert",
                    "remote workers need a certificate to trust (a worker's state_dir/cert.pem, or their CA)",
                );
            }
        }
        if self.batch_size == 0 {
            return bad("batch_size", "must be at least 1");
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return bad(
                "rank",
                &format!(
                    "rank {} is outside world_size {}",
                    self.rank, self.world_size
                ),
            );
        }
        if self.ring_batches < 2 {
            return bad("ring_batches", "must be at least 2");
        }
        if !(1..=16).contains(&self.connections_per_worker) {
            return bad("connections_per_worker", "must be 1 to 16");
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
        if self.max_field_bytes == 0 {
            return bad("max_field_bytes", "must be at least 1");
        }
        check_pipeline(&self.pipeline)?;
        if self.order == Order::Plan && self.lookahead < u64::from(self.batch_size) {
            return bad(
                "lookahead",
                "must be at least batch_size, or workers could not fill one batch ahead",
            );
        }
        manifest
            .validate(&self.dataset_name)
            .map_err(|e| ClientError::Config {
                key: "dataset",
                detail: e.to_string(),
            })?;
        // An impossible world (more ranks than samples under "drop", a rank outside it) is
        // refused here, before a runtime, a connection or a plan is made.
        let counts: Vec<u64> = manifest.shards.iter().map(|s| s.samples).collect();
        let plan_config = PlanConfig {
            seed: self.seed,
            world_size: self.world_size,
            policy: self.shuffle,
            remainder: self.remainder,
            max_unit_samples: self.max_unit_samples,
        };
        sluice_plan::validate(&counts, &plan_config, self.rank).map_err(|e| {
            ClientError::Config {
                key: "world_size",
                detail: e.to_string(),
            }
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-client")
            .enable_all()
            .build()
            .map_err(|e| ClientError::Runtime(e.to_string()))?;
        let quic = match (&workers, &self.trust_cert) {
            (Workers::Remote(_), Some(trust)) => {
                let mut t = quinn::TransportConfig::default();
                t.max_concurrent_bidi_streams(0u32.into());
                t.max_concurrent_uni_streams(0u32.into());
                let window = self.receive_window.min(u32::MAX as u64) as u32;
                t.stream_receive_window(window.into());
                t.receive_window(window.into());
                t.keep_alive_interval(Some(self.heartbeat));
                let mut mtu = quinn::MtuDiscoveryConfig::default();
                mtu.upper_bound(sluice_wire::quic::MAX_UDP_PAYLOAD);
                t.mtu_discovery_config(Some(mtu));
                t.max_idle_timeout(self.silence.try_into().ok());
                let config = crate::tls::client_config(trust, t)?;
                let endpoint = quic_endpoint(&runtime)?;
                Some((endpoint, config))
            }
            _ => None,
        };
        let samples_per_rank = sluice_plan::samples_per_rank(
            manifest.total_samples(),
            self.world_size,
            self.remainder,
        );
        let batch_plan = BatchPlan::new(
            samples_per_rank,
            u64::from(self.batch_size),
            self.last_batch,
        );
        if batch_plan.batches == 0 && manifest.total_samples() > 0 {
            let detail = format!(
                "each of the {} ranks gets {samples_per_rank} of the dataset's {} samples, so \
                 an epoch would have no batch at all (batch_size {}, drop_last {}, remainder \
                 {:?}): use fewer ranks, a smaller batch_size, or drop_last=False",
                self.world_size,
                manifest.total_samples(),
                self.batch_size,
                self.last_batch == LastBatch::Drop,
                self.remainder,
            );
            return Err(ClientError::Config {
                key: "drop_last",
                detail,
            });
        }
        // Samples the client may hold between arrival and batch: the plan order's reorder
        // bound (see ARCHITECTURE.md, "Sample order") and every worker's credits.
        let links = match &workers {
            Workers::Remote(names) => names.len() as u64 * u64::from(self.connections_per_worker),
            Workers::InProcess(_) => 0,
        };
        let held = self.lookahead
            + u64::from(self.mixing.buffer_samples)
            + u64::from(self.mixing.window_units) * self.max_unit_samples
            + links * u64::from(self.credits_per_worker);
        let held = held.min(1 << 16);
        Ok(Loader {
            buffers: Arc::new(BufferPool::new(held as usize)),
            fingerprint: fingerprint(&manifest),
            manifest: Arc::new(manifest),
            plan_config,
            batch_plan,
            workers,
            quic,
            runtime: Some(runtime),
            allocator: Arc::new(Recycling::new(self.allocator.clone(), self.ring_batches)),
            progress: Arc::new(Mutex::new(None)),
            resume: Mutex::new(None),
            next: Mutex::new(None),
            last_epoch: Mutex::new(None),
            passes: std::sync::atomic::AtomicU64::new(0),
            stats: Arc::new(Stats::new()),
            settings: self,
        })
    }
}

/// Parses `pipeline` with the workers' grammar and checks that its tensors fit the largest
/// frame a worker sends: what every worker would refuse at job open, as an error here instead
/// of at the first batch. `LoaderBuilder::build` calls it; a binding may call it earlier.
pub fn check_pipeline(pipeline: &str) -> Result<sluice_wire::spec::PipelineSpec, ClientError> {
    let bad = |detail: String| ClientError::Config {
        key: "pipeline",
        detail,
    };
    let spec: sluice_wire::spec::PipelineSpec = pipeline
        .parse()
        .map_err(|e: sluice_wire::spec::SpecError| bad(e.to_string()))?;
    let tensor = spec.output_bytes() as u64;
    let largest = u64::from(Limits::default().max_payload);
    if tensor > largest {
        return Err(bad(format!(
            "{pipeline:?} makes tensors of {tensor} bytes, over the largest frame a worker \
             sends ({largest} bytes, limits.max_payload_bytes): choose a smaller output size"
        )));
    }
    Ok(spec)
}

/// The client: yields this rank's batches, epoch after epoch.
pub struct Loader {
    settings: LoaderBuilder,
    manifest: Arc<Manifest>,
    fingerprint: u64,
    plan_config: PlanConfig,
    batch_plan: BatchPlan,
    workers: Workers,
    quic: Option<(quinn::Endpoint, quinn::ClientConfig)>,
    /// Always `Some` until drop.
    runtime: Option<tokio::runtime::Runtime>,
    /// The settings' allocator, keeping finished epochs' ring buffers for the next ones.
    allocator: Arc<dyn HostAllocator>,
    /// Spare tensor buffers for samples between arrival and batch, kept across epochs.
    buffers: Arc<BufferPool>,
    progress: Arc<Mutex<Option<Progress>>>,
    resume: Mutex<Option<Pending>>,
    /// The epoch after the current one, started early.
    next: Mutex<Option<Early>>,
    /// The epoch `epoch()` was last called for.
    last_epoch: Mutex<Option<u64>>,
    /// The number of `Epoch`s handed out (each one's `pass`).
    passes: std::sync::atomic::AtomicU64,
    stats: Arc<Stats>,
}

/// What the consumer has been handed in the current epoch.
///
/// It records one `Epoch` (its `pass`): the one the consumer trains on. A pass of the same
/// epoch begun while that one is still being read (a peek, `next(iter(loader))` in the middle
/// of an epoch) is read on its own and recorded nowhere, so a checkpoint always means the
/// batches the training pass was handed. A pass of another epoch, a loaded checkpoint, or any
/// pass once the recorded one has ended (run out, been dropped, or handed out every batch)
/// becomes the recorded pass.
struct Progress {
    epoch: u64,
    /// The earlier worlds of this epoch (elastic resumes), oldest first.
    resumed: Vec<Segment>,
    batches: u64,
    ledger: Ledger,
    /// The `Epoch` whose batches this records.
    pass: u64,
    /// That `Epoch` can still hand out batches.
    open: bool,
}

/// An epoch planned and started, not yet handed to the consumer.
struct Started {
    epoch: Epoch,
    /// What the consumer will have been handed once it takes the epoch.
    progress: Option<Progress>,
    links: Vec<String>,
    /// The gate of the epoch after this one, to start it early (`prefetch_next_epoch`).
    next: Option<Predecessor>,
}

/// The next epoch, started early behind `earlier` (its `Epoch`'s cancel token and its
/// coordinator's end).
struct Early {
    started: Started,
    earlier: (CancellationToken, CancellationToken),
}

impl Early {
    /// The consumer is done with the earlier epoch: it ran to its end or was dropped. (An
    /// earlier epoch still being read keeps the ring buffers it needs, so a consumer that
    /// reads two epochs at once gets this one started afresh, with a ring of its own.)
    fn earlier_ended(&self) -> bool {
        self.earlier.0.is_cancelled() || self.earlier.1.is_cancelled()
    }

    /// It can be taken over: it is `epoch`, the earlier one is done, and it has not failed
    /// (say, no worker answered it while the earlier one ran: asked for now, it tries anew).
    fn takes_over(&self, epoch: u64) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.started.epoch.epoch == epoch
            && self.earlier_ended()
            && !self.started.epoch.counters.failed.load(Relaxed)
    }
}

/// A loaded checkpoint, waiting for `epoch(e)`.
struct Pending {
    epoch: u64,
    resumed: Vec<Segment>,
    batches: u64,
    /// The ledger of this rank (same world size); `None` for an elastic resume, which starts
    /// a new segment with nothing delivered.
    ledger: Option<LedgerRecord>,
}

/// An earlier part of an epoch: a world of `world_size` ranks each took `batches` batches
/// of its plan-order sequence, then the job stopped and resumed at another world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub world_size: u32,
    pub batches: u64,
}

/// A compact record of an epoch in progress: restoring it delivers exactly the rest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    /// A hash of the manifest's shards' content (size, samples, checksum, in order; version 1
    /// hashed their URLs too).
    pub dataset: u64,
    /// Each shard's content digest (its low 32 bits), for datasets of up to 65,536 shards:
    /// a mismatch then names the first shard that differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<u32>,
    pub seed: u64,
    pub world_size: u32,
    pub rank: u32,
    pub shuffle: String,
    /// The delivery order it was taken under (`plan` or `arrival`).
    #[serde(default = "Order::legacy")]
    pub order: Order,
    pub batch_size: u32,
    /// The plan's other settings (remainder, unit size, last batch, mixing), which must
    /// match too.
    #[serde(default)]
    pub plan: String,
    pub epoch: u64,
    /// Earlier worlds of this epoch, oldest first, when it was resumed at another world size.
    #[serde(default)]
    pub resumed: Vec<Segment>,
    /// Batches already handed to the consumer (in the current segment).
    pub batches: u64,
    /// Samples in those batches (delivered or skipped).
    pub ledger: LedgerRecord,
}

impl Checkpoint {
    pub const VERSION: u32 = 2;

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ClientError> {
        if bytes.len() > 256 << 20 {
            return Err(ClientError::Checkpoint(format!(
                "{} bytes is too large",
                bytes.len()
            )));
        }
        let c: Checkpoint = serde_json::from_slice(bytes).map_err(|e| {
            // serde's "at line 1 column 299" means nothing to whoever saved the state.
            let text = e.to_string();
            let what = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(w, _)| w);
            ClientError::Checkpoint(format!(
                "this is not a Sluice loader's state_dict() ({what})"
            ))
        })?;
        if !(1..=Self::VERSION).contains(&c.version) {
            return Err(ClientError::Checkpoint(format!(
                "version {} (this build reads {})",
                c.version,
                Self::VERSION
            )));
        }
        Ok(c)
    }
}

/// The dataset's identity for checkpoints: each shard's content (size, sample count,
/// checksum) in manifest order, and not where it lives, so a checkpoint resumes after the
/// shards moved to another directory, mount, cluster or storage node.
fn fingerprint(manifest: &Manifest) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for s in &manifest.shards {
        h.update(&shard_digest(s).to_le_bytes());
    }
    h.digest()
}

/// One shard's content, for naming the first shard that differs from a checkpoint's.
fn shard_digest(s: &sluice_shard::ShardInfo) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&s.size.to_le_bytes());
    h.update(&s.samples.to_le_bytes());
    h.update(&s.checksum.0.to_le_bytes());
    h.digest()
}

/// Checkpoints of version 1 hashed each shard's URL too.
fn fingerprint_v1(manifest: &Manifest) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for s in &manifest.shards {
        h.update(s.url.as_bytes());
        h.update(&s.size.to_le_bytes());
        h.update(&s.samples.to_le_bytes());
        h.update(&s.checksum.0.to_le_bytes());
    }
    h.digest()
}

/// Shards up to which a checkpoint lists each shard's digest (4 bytes a shard: 256 KiB of
/// JSON at most), so a mismatch can name the first shard that differs.
const DIGESTS_LISTED: usize = 65_536;

impl Loader {
    pub fn builder() -> LoaderBuilder {
        LoaderBuilder::default()
    }

    /// The dataset's content fingerprint (each shard's size, sample count and checksum, in
    /// manifest order): every rank of a job must have the same, or their plans disagree.
    pub fn dataset_fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// (rank, world size) this loader plans for.
    pub fn rank_and_world(&self) -> (u32, u32) {
        (self.settings.rank, self.settings.world_size)
    }

    /// Batches every rank yields per epoch.
    pub fn batches_per_epoch(&self) -> u64 {
        self.batch_plan.batches
    }

    /// Batches of `epoch` as a training loop counts them. Usually [`Self::batches_per_epoch`];
    /// for an epoch resumed at another world size, the batches each rank was handed before
    /// (in every earlier world) plus this world's share of the rest, so a loop that restored
    /// its step count from the same checkpoint (Lightning's) runs exactly to the epoch's end.
    pub fn batches_in_epoch(&self, epoch: u64) -> u64 {
        let resumed = self
            .resume
            .lock()
            .ok()
            .and_then(|r| {
                r.as_ref()
                    .filter(|p| p.epoch == epoch)
                    .map(|p| p.resumed.clone())
            })
            .or_else(|| {
                let progress = self.progress.lock().ok()?;
                progress
                    .as_ref()
                    .filter(|p| p.epoch == epoch)
                    .map(|p| p.resumed.clone())
            })
            .unwrap_or_default();
        if resumed.is_empty() {
            return self.batch_plan.batches;
        }
        let s = &self.settings;
        let before: u64 = resumed.iter().map(|seg| seg.batches).sum();
        match self.segment(epoch, &resumed, s.world_size, s.rank) {
            Ok((_, plan)) => before + plan.batches,
            Err(_) => self.batch_plan.batches,
        }
    }

    /// Samples every rank is planned per epoch (after the last-batch policy).
    pub fn samples_per_epoch(&self) -> u64 {
        self.batch_plan.samples
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// This rank's work units for `epoch`, cut to the samples that make whole batches under
    /// the last-batch policy.
    pub fn plan(&self, epoch: u64) -> Result<Vec<WorkUnit>, ClientError> {
        let s = &self.settings;
        Ok(self.segment(epoch, &[], s.world_size, s.rank)?.0)
    }

    /// The state of the current epoch: restoring it with [`Loader::load_state_dict`] (in a
    /// new process too) and calling `epoch` with the same number delivers exactly the rest.
    pub fn state_dict(&self) -> Option<Checkpoint> {
        let progress = self.progress.lock().ok()?;
        let p = progress.as_ref()?;
        Some(Checkpoint {
            version: Checkpoint::VERSION,
            dataset: self.fingerprint,
            shards: if self.manifest.shards.len() <= DIGESTS_LISTED {
                self.manifest
                    .shards
                    .iter()
                    .map(|s| shard_digest(s) as u32)
                    .collect()
            } else {
                Vec::new()
            },
            seed: self.settings.seed,
            world_size: self.settings.world_size,
            rank: self.settings.rank,
            shuffle: self.settings.shuffle.to_string(),
            order: self.settings.order,
            batch_size: self.settings.batch_size,
            plan: self.plan_settings(),
            epoch: p.epoch,
            resumed: p.resumed.clone(),
            batches: p.batches,
            ledger: p.ledger.to_record(),
        })
    }

    /// Why `checkpoint` was taken on another dataset than this loader's, as precisely as it
    /// allows: the first shard that differs, or how many shards and samples each has.
    fn dataset_mismatch(&self, checkpoint: &Checkpoint, ours: u64) -> String {
        let m = &self.manifest;
        let head = format!(
            "it was taken on another dataset (fingerprint {:016x}; this loader's manifest gives \
             {ours:016x})",
            checkpoint.dataset
        );
        if checkpoint.version == 1 {
            return format!(
                "{head}: checkpoints of version 1 hash shard URLs too, so shards that moved \
                 cannot resume them; a new checkpoint (version 2) can"
            );
        }
        if checkpoint.shards.is_empty() {
            return format!(
                "{head}: some shard's size, sample count or checksum differs, or the shards \
                 are in another order ({} shards, {} samples here)",
                m.shards.len(),
                m.total_samples()
            );
        }
        let differs = checkpoint
            .shards
            .iter()
            .zip(&m.shards)
            .position(|(theirs, s)| *theirs != shard_digest(s) as u32);
        match differs {
            Some(i) => format!(
                "{head}: shard #{i} ({}) is not the shard it had there (its size, sample count \
                 or checksum differs: was it rewritten, or the list reordered?)",
                m.shards[i].url
            ),
            None => format!(
                "{head}: it had {} shards, this manifest has {}",
                checkpoint.shards.len(),
                m.shards.len()
            ),
        }
    }

    /// Restores a checkpoint; the next `epoch(checkpoint.epoch)` resumes it. Errors say what
    /// does not match this loader.
    pub fn load_state_dict(&self, checkpoint: Checkpoint) -> Result<(), ClientError> {
        self.load_state_dicts(std::slice::from_ref(&checkpoint))
    }

    /// Restores the checkpoints of a job's ranks, taken at the same step; the next
    /// `epoch(e)` delivers exactly the rest of their epoch.
    ///
    /// At the same world size this rank's own checkpoint is used; without it (a framework
    /// that saved rank 0's state only), in plan order any rank's checkpoint gives this rank's
    /// place too, since DDP ranks are handed the same number of batches. At another world size
    /// (plan order only) the rest of the epoch, what every old rank had not yet delivered,
    /// is split equally across the new ranks; one checkpoint is enough, since in plan order
    /// an old rank's delivered samples are its sequence's first `batches × batch_size`. The
    /// checkpoints given must agree on dataset, seed, world_size, shuffle, order, batch_size,
    /// plan settings, epoch, earlier segments and `batches` (the global step: DDP ranks stop
    /// together); each error names the field.
    pub fn load_state_dicts(&self, checkpoints: &[Checkpoint]) -> Result<(), ClientError> {
        let s = &self.settings;
        let Some(first) = checkpoints.first() else {
            return Err(ClientError::Checkpoint("no checkpoint given".into()));
        };
        for c in &checkpoints[1..] {
            let disagree = |field: &str, a: String, b: String| {
                Err(ClientError::Checkpoint(format!(
                    "ranks {} and {} disagree on {field}: {a} and {b}",
                    first.rank, c.rank
                )))
            };
            let pairs = [
                ("dataset", first.dataset.to_string(), c.dataset.to_string()),
                ("seed", first.seed.to_string(), c.seed.to_string()),
                (
                    "world_size",
                    first.world_size.to_string(),
                    c.world_size.to_string(),
                ),
                ("shuffle", first.shuffle.clone(), c.shuffle.clone()),
                ("order", first.order.to_string(), c.order.to_string()),
                (
                    "batch_size",
                    first.batch_size.to_string(),
                    c.batch_size.to_string(),
                ),
                ("plan", first.plan.clone(), c.plan.clone()),
                ("epoch", first.epoch.to_string(), c.epoch.to_string()),
                (
                    "resumed",
                    format!("{:?}", first.resumed),
                    format!("{:?}", c.resumed),
                ),
            ];
            for (field, a, b) in pairs {
                if a != b {
                    return disagree(field, a, b);
                }
            }
            if first.batches != c.batches {
                return Err(ClientError::Checkpoint(format!(
                    "ranks {} and {} disagree on batches (the global step): {} and {}; states \
                     given together must be taken at the same step on every rank (as DDP \
                     steps together), or pass this rank's own state alone",
                    first.rank, c.rank, first.batches, c.batches
                )));
            }
        }
        let mut ranks: Vec<u32> = checkpoints.iter().map(|c| c.rank).collect();
        ranks.sort_unstable();
        if let Some(w) = ranks.windows(2).find(|w| w[0] == w[1]) {
            return Err(ClientError::Checkpoint(format!(
                "rank {} is given twice",
                w[0]
            )));
        }
        if let Some(r) = ranks.iter().find(|&&r| r >= first.world_size) {
            return Err(ClientError::Checkpoint(format!(
                "rank {r} is outside its world_size {}",
                first.world_size
            )));
        }
        let mismatch = |what: &str, theirs: String, ours: String| {
            Err(ClientError::Checkpoint(format!(
                "it was taken with {what} {theirs}, this loader has {ours}"
            )))
        };
        let ours = if first.version == 1 {
            fingerprint_v1(&self.manifest)
        } else {
            self.fingerprint
        };
        if first.dataset != ours {
            return Err(ClientError::Checkpoint(self.dataset_mismatch(first, ours)));
        }
        if first.seed != s.seed {
            return mismatch("seed", first.seed.to_string(), s.seed.to_string());
        }
        if first.shuffle != s.shuffle.to_string() {
            return mismatch("shuffle", first.shuffle.clone(), s.shuffle.to_string());
        }
        if first.batch_size != s.batch_size {
            return mismatch(
                "batch_size",
                first.batch_size.to_string(),
                s.batch_size.to_string(),
            );
        }
        if first.order != s.order {
            return mismatch("order", first.order.to_string(), s.order.to_string());
        }
        if !first.plan.is_empty() && first.plan != self.plan_settings() {
            return mismatch("plan settings", first.plan.clone(), self.plan_settings());
        }
        let (units, batch_plan) =
            self.segment(first.epoch, &first.resumed, first.world_size, first.rank)?;
        if first.batches > batch_plan.batches {
            return Err(ClientError::Checkpoint(format!(
                "{} batches delivered, more than the epoch's {}",
                first.batches, batch_plan.batches
            )));
        }
        let pending = if first.world_size == s.world_size {
            match checkpoints.iter().find(|c| c.rank == s.rank) {
                Some(mine) => self.own_rank(mine)?,
                None => self.another_rank(first, &ranks)?,
            }
        } else {
            if s.order != Order::Plan {
                return Err(ClientError::Checkpoint(format!(
                    "it was taken at world_size {}, this loader has {}: a new world size needs \
                     order \"plan\" (in arrival order a checkpoint names only its own rank's \
                     samples)",
                    first.world_size, s.world_size
                )));
            }
            self.checked_ledger(first, &units)?;
            let mut resumed = first.resumed.clone();
            resumed.push(Segment {
                world_size: first.world_size,
                batches: first.batches,
            });
            Pending {
                epoch: first.epoch,
                resumed,
                batches: 0,
                ledger: None,
            }
        };
        if let Ok(mut r) = self.resume.lock() {
            *r = Some(pending);
        }
        // An epoch started early would not resume the checkpoint.
        if let Ok(mut n) = self.next.lock() {
            n.take();
        }
        Ok(())
    }

    /// The ledger `c` records over `units` (its rank's plan), checked in plan order to be
    /// the plan's first `c.batches` batches.
    fn checked_ledger(&self, c: &Checkpoint, units: &[WorkUnit]) -> Result<Ledger, ClientError> {
        let mut ledger = Ledger::new(units);
        ledger.apply(&c.ledger).map_err(ClientError::Checkpoint)?;
        if self.settings.order == Order::Plan {
            let at = (c.epoch, c.resumed.len() as u32, c.rank);
            self.check_plan_prefix(units, at, c.batches, &ledger)?;
        }
        Ok(ledger)
    }

    /// This rank's own checkpoint at the same world size: its ledger, checked against the plan.
    fn own_rank(&self, mine: &Checkpoint) -> Result<Pending, ClientError> {
        let s = &self.settings;
        let (units, _) = self.segment(mine.epoch, &mine.resumed, s.world_size, s.rank)?;
        self.checked_ledger(mine, &units)?;
        Ok(Pending {
            epoch: mine.epoch,
            resumed: mine.resumed.clone(),
            batches: mine.batches,
            ledger: Some(mine.ledger.clone()),
        })
    }

    /// Another rank's checkpoint at the same world size (a framework that saves rank 0's state
    /// only, as Lightning and Accelerate do). In plan order every rank had been handed the
    /// first `batches` batches of its own sequence (DDP ranks step together), so that rank's
    /// checkpoint, checked against its own plan, gives this rank's ledger too: the first
    /// `batches × batch_size` positions of this rank's sequence.
    fn another_rank(&self, theirs: &Checkpoint, ranks: &[u32]) -> Result<Pending, ClientError> {
        let s = &self.settings;
        if s.order != Order::Plan {
            return Err(ClientError::Checkpoint(format!(
                "this is rank {}, and the checkpoint is rank {ranks:?}'s: in order \"arrival\" a \
                 checkpoint names only its own rank's samples, so each rank must load its own \
                 state (save every rank's state_dict, or use order=\"plan\", where any one \
                 rank's state resumes every rank)",
                s.rank
            )));
        }
        let depth = theirs.resumed.len() as u32;
        let (their_units, _) =
            self.segment(theirs.epoch, &theirs.resumed, s.world_size, theirs.rank)?;
        self.checked_ledger(theirs, &their_units)?;
        let (units, _) = self.segment(theirs.epoch, &theirs.resumed, s.world_size, s.rank)?;
        let sequence = self.sequence(&units, theirs.epoch, depth, s.rank)?;
        let prefix = (theirs.batches * u64::from(s.batch_size)).min(sequence.len());
        let mut ledger = Ledger::new(&units);
        for (u, i) in (0..prefix).filter_map(|p| sequence.at(p)) {
            if let Some(w) = units.get(u as usize) {
                ledger.record(u64::from(u), w.shard, i);
            }
        }
        Ok(Pending {
            epoch: theirs.epoch,
            resumed: theirs.resumed.clone(),
            batches: theirs.batches,
            ledger: Some(ledger.to_record()),
        })
    }

    /// The plan settings a checkpoint must share besides the named fields.
    fn plan_settings(&self) -> String {
        let s = &self.settings;
        format!(
            "remainder={:?} unit={} last={:?} mix={}x{}",
            s.remainder,
            s.max_unit_samples,
            s.last_batch,
            s.mixing.window_units,
            s.mixing.buffer_samples
        )
    }

    /// Rank `rank`'s units (cut to whole batches) and batch plan for `epoch` in a world of
    /// `world` ranks, after the earlier segments `resumed` (none: the epoch as planned).
    fn segment(
        &self,
        epoch: u64,
        resumed: &[Segment],
        world: u32,
        rank: u32,
    ) -> Result<(Vec<WorkUnit>, BatchPlan), ClientError> {
        let s = &self.settings;
        let config = PlanConfig {
            world_size: world,
            ..self.plan_config.clone()
        };
        let batch_size = u64::from(s.batch_size);
        let (units, samples) = match resumed.split_last() {
            None => {
                let units = sluice_plan::plan(&self.manifest, &config, epoch, rank)?;
                let total = self.manifest.total_samples();
                (
                    units,
                    sluice_plan::samples_per_rank(total, world, s.remainder),
                )
            }
            Some((last, earlier)) => {
                let mut rest = Vec::new();
                for q in 0..last.world_size {
                    let (units, _) = self.segment(epoch, earlier, last.world_size, q)?;
                    let seq = self.sequence(&units, epoch, earlier.len() as u32, q)?;
                    let done = (last.batches * batch_size).min(seq.len());
                    rest.extend(remaining_pieces(&units, &seq, done));
                }
                let remaining = sluice_plan::assign::total(&rest);
                let counts: Vec<u64> = self.manifest.shards.iter().map(|s| s.samples).collect();
                let depth = resumed.len() as u32;
                let units = sluice_plan::resume_plan(rest, &counts, &config, epoch, rank, depth)?;
                (
                    units,
                    sluice_plan::samples_per_rank(remaining, world, s.remainder),
                )
            }
        };
        let batch_plan = BatchPlan::new(samples, batch_size, s.last_batch);
        Ok((cut_units(units, batch_plan.samples), batch_plan))
    }

    /// What this rank will deliver in `epoch` from now: the plan, or the rest of a loaded
    /// checkpoint's epoch (this rank's share of it after a change of world size).
    pub fn pending(&self, epoch: u64) -> Result<Vec<WorkUnit>, ClientError> {
        let s = &self.settings;
        let resume = self.resume.lock().ok();
        let Some(p) = resume
            .as_ref()
            .and_then(|r| r.as_ref())
            .filter(|p| p.epoch == epoch)
        else {
            return self.plan(epoch);
        };
        let (units, _) = self.segment(epoch, &p.resumed, s.world_size, s.rank)?;
        let Some(record) = &p.ledger else {
            return Ok(units);
        };
        let mut ledger = Ledger::new(&units);
        ledger.apply(record).map_err(ClientError::Checkpoint)?;
        Ok(units
            .iter()
            .flat_map(|u| {
                ledger
                    .missing(u64::from(u.id), u.start, u.end)
                    .into_iter()
                    .map(move |(start, end)| WorkUnit { start, end, ..*u })
            })
            .collect())
    }

    /// The delivery order of `units` (this rank's plan for `epoch`; `depth` earlier
    /// segments when the epoch was resumed at another world size).
    fn sequence(
        &self,
        units: &[WorkUnit],
        epoch: u64,
        depth: u32,
        rank: u32,
    ) -> Result<Sequence, ClientError> {
        let s = &self.settings;
        let seed = sluice_plan::segment_seed(s.seed, depth);
        Ok(Sequence::new(units, s.mixing, seed, epoch, rank)?)
    }

    /// In plan order, the samples in the first `batches` batches are exactly the sequence's
    /// first `batches × batch_size` positions: a checkpoint that says otherwise was not
    /// taken under this plan.
    fn check_plan_prefix(
        &self,
        units: &[WorkUnit],
        (epoch, depth, rank): (u64, u32, u32),
        batches: u64,
        ledger: &Ledger,
    ) -> Result<(), ClientError> {
        let sequence = self.sequence(units, epoch, depth, rank)?;
        let prefix = (batches * u64::from(self.settings.batch_size)).min(sequence.len());
        let in_prefix = (0..prefix).filter_map(|p| sequence.at(p)).all(|(u, i)| {
            units
                .get(u as usize)
                .is_some_and(|w| ledger.check(u64::from(u), w.shard, i) == Verdict::Duplicate)
        });
        if !in_prefix || ledger.accounted() != prefix {
            return Err(ClientError::Checkpoint(format!(
                "the {} samples it records are not the first {batches} batches of this \
                 loader's plan: it was taken with other settings (mixing, unit size, pipeline \
                 order) or by another version of sluice",
                ledger.accounted()
            )));
        }
        Ok(())
    }

    /// Starts epoch `epoch` (or resumes it from a loaded checkpoint) and returns its batches.
    ///
    /// With `prefetch_next_epoch` (the default), epoch `epoch + 1` is started behind it: its
    /// first units go to the workers once this epoch has handed out all of its own, so the
    /// workers do not idle while the last batches drain. A later `epoch(epoch + 1)` takes it
    /// over when this epoch has ended or been dropped; any other call (another epoch, a loaded
    /// checkpoint) cancels it. It is started on the first call and on a call for the epoch
    /// after the one before, not when the same epoch is asked for again.
    pub fn epoch(&self, epoch: u64) -> Result<Epoch, ClientError> {
        let resume = self.resume.lock().ok().and_then(|mut r| r.take());
        let resume = resume.filter(|p| p.epoch == epoch);
        let resuming = resume.is_some();
        let early = self.next.lock().ok().and_then(|mut n| n.take());
        let mut started = match early {
            Some(early) if resume.is_none() && early.takes_over(epoch) => {
                tracing::debug!(epoch, "taking over the epoch started early");
                early.started
            }
            // Dropping an epoch started early cancels it.
            _ => self.start(epoch, resume, None)?,
        };
        let pass = 1 + self
            .passes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        started.epoch.pass = pass;
        if let Ok(mut p) = self.progress.lock() {
            let peek = !resuming && p.as_ref().is_some_and(|p| p.open && p.epoch == epoch);
            if peek {
                tracing::debug!(
                    epoch,
                    "another pass of the epoch is being read: this one is not checkpointed"
                );
            } else {
                *p = started.progress.take().map(|mut progress| {
                    progress.pass = pass;
                    progress
                });
            }
        }
        self.stats.set_workers(&started.links);
        // Only a consumer that goes epoch after epoch gets the next one started early: one that
        // reads the same epoch again and again (an evaluation loop) would waste it each time.
        let previous = self
            .last_epoch
            .lock()
            .ok()
            .and_then(|mut l| l.replace(epoch));
        let in_order = previous.is_none_or(|p| epoch == p + 1);
        if let Some(after) = started.next.take().filter(|_| in_order) {
            let earlier = (started.epoch.cancel.clone(), after.ended_token());
            match self.start(epoch + 1, None, Some(after)) {
                Ok(next) => {
                    if let Ok(mut n) = self.next.lock() {
                        *n = Some(Early {
                            started: next,
                            earlier,
                        });
                    }
                }
                // The same error comes back if the consumer asks for that epoch.
                Err(e) => tracing::debug!(epoch = epoch + 1, "not started early: {e}"),
            }
        }
        Ok(started.epoch)
    }

    /// Plans epoch `epoch` (or the rest of it, `resume`) and starts its links and coordinator;
    /// `after`: started early, behind the epoch before (see `Coordinator::after`).
    fn start(
        &self,
        epoch: u64,
        resume: Option<Pending>,
        after: Option<Predecessor>,
    ) -> Result<Started, ClientError> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| ClientError::Runtime("the loader is shutting down".into()))?;
        let s = &self.settings;
        let resumed = resume
            .as_ref()
            .map(|p| p.resumed.clone())
            .unwrap_or_default();
        let (units, batch_plan) = self.segment(epoch, &resumed, s.world_size, s.rank)?;
        let mut ledger = Ledger::new(&units);
        let mut first_batch = 0;
        if let Some(p) = &resume {
            if let Some(record) = &p.ledger {
                ledger.apply(record).map_err(ClientError::Checkpoint)?;
            }
            first_batch = p.batches;
            tracing::info!(
                epoch,
                batches = p.batches,
                samples = ledger.accounted(),
                earlier_worlds = ?p.resumed,
                "resuming"
            );
        }
        let depth = resumed.len() as u32;
        let reorder = match s.order {
            Order::Plan => Reorder::plan(
                Arc::new(self.sequence(&units, epoch, depth, s.rank)?),
                first_batch * u64::from(s.batch_size),
            ),
            Order::Arrival => Reorder::arrival(ShuffleBuffer::new(
                s.mixing.buffer_samples as usize,
                s.seed,
                epoch,
                s.rank,
            )),
        };
        let progress = Some(Progress {
            epoch,
            resumed,
            batches: first_batch,
            ledger: ledger.clone(),
            pass: 0,
            open: first_batch < batch_plan.batches,
        });
        let job = (epoch << 32) ^ (u64::from(s.rank) << 16) ^ (self.fingerprint & 0xffff);
        let spec = JobSpec {
            job,
            dataset: s.dataset_name.clone(),
            pipeline: s.pipeline.clone(),
            seed: s.seed,
            epoch,
            rank: s.rank,
            world_size: s.world_size,
            batch_size: s.batch_size,
            fail_on_bad_sample: s.fail_on_bad_sample,
            fields: s.fields.clone(),
            label: s.label.clone(),
            max_field_bytes: s.max_field_bytes,
        };
        let cancel = CancellationToken::new();
        let counters = Arc::new(EpochCounters::default());
        // Room for every credit of every link, so a reader waits only on a slow consumer.
        let links_max = match &self.workers {
            Workers::InProcess(_) => 1,
            Workers::Remote(w) => w.len().max(1) * 4 * s.connections_per_worker as usize,
        };
        let (event_tx, event_rx) = mpsc::channel(links_max * s.credits_per_worker as usize + 64);
        let (out_tx, out_rx) = mpsc::channel(s.ring_batches);
        let mut links = Vec::new();
        let mut tasks: Vec<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            Vec::new();
        match &self.workers {
            Workers::InProcess(runner) => {
                let (tx, rx) = mpsc::channel(64);
                links.push(("in-process".to_string(), tx));
                tasks.push(Box::pin(run_local(
                    0,
                    runner.clone(),
                    spec.clone(),
                    rx,
                    event_tx.clone(),
                    cancel.clone(),
                )));
            }
            Workers::Remote(names) => {
                let (endpoint, config) = self
                    .quic
                    .clone()
                    .ok_or_else(|| ClientError::Runtime("no QUIC endpoint".into()))?;
                for (name, addr) in self.resolve(names)? {
                    let same_host = match s.same_host {
                        SameHost::Off => None,
                        mode => match crate::same_host::socket_for(&s.same_host_dir, addr) {
                            Ok(socket) => Some(SameHostRoute {
                                socket,
                                required: mode == SameHost::Require,
                            }),
                            Err(why) if mode == SameHost::Require => {
                                return Err(ClientError::Config {
                                    key: "same_host",
                                    detail: format!("required, but worker {name}: {why}"),
                                });
                            }
                            Err(why) => {
                                tracing::info!(worker = %name, "QUIC, not same-host: {why}");
                                None
                            }
                        },
                    };
                    if let Some(r) = &same_host {
                        tracing::info!(worker = %name, socket = %r.socket.display(),
                            "same-host transport");
                    }
                    // Several QUIC connections spread one worker's packets over tasks on
                    // both sides; same-host needs none.
                    let connections = match same_host {
                        Some(_) => 1,
                        None => s.connections_per_worker,
                    };
                    for c in 1..=connections {
                        let (tx, rx) = mpsc::channel(64);
                        let label = match connections {
                            1 => name.clone(),
                            _ => format!("{name} #{c}"),
                        };
                        let link = RemoteLink {
                            link: links.len(),
                            addr,
                            name: label.clone(),
                            endpoint: endpoint.clone(),
                            client_config: config.clone(),
                            same_host: same_host.clone(),
                            credits: s.credits_per_worker,
                            receive_window: s.receive_window,
                            token: s.token.clone().unwrap_or_default(),
                            client: format!("{} rank {}", s.client_name, s.rank),
                            job: spec.clone(),
                            heartbeat: s.heartbeat,
                            silence: s.silence,
                            connect_timeout: s.connect_timeout,
                            limits: Limits::default(),
                            buffers: self.buffers.clone(),
                        };
                        links.push((label, tx));
                        tasks.push(Box::pin(link.run(rx, event_tx.clone(), cancel.clone())));
                    }
                }
            }
        }
        drop(event_tx);
        let names: Vec<String> = links.iter().map(|l| l.0.clone()).collect();
        let settings = Settings {
            job,
            epoch,
            batch_plan,
            first_batch,
            short_batch: s.short_batch,
            credits_per_worker: s.credits_per_worker,
            receive_window: s.receive_window,
            units_per_worker: s.units_per_worker,
            ring_batches: s.ring_batches,
            worker_wait: s.worker_wait,
            max_unit_attempts: s.max_unit_attempts,
            lookahead: s.lookahead,
            hedge_after: s.hedge_after,
            labels: s.labels,
        };
        let early = s.prefetch_next_epoch && s.epochs.is_none_or(|n| epoch + 1 < n);
        let (before, next) = match early {
            true => {
                let (successor, predecessor) = handoff();
                (Some(successor), Some(predecessor))
            }
            false => (None, None),
        };
        let mut coordinator = Coordinator::new(
            settings,
            self.manifest.clone(),
            (ledger, reorder),
            links,
            self.allocator.clone(),
            counters.clone(),
            self.stats.clone(),
        );
        if let Some(earlier) = after {
            coordinator = coordinator.after(earlier);
        }
        if let Some(successor) = before {
            coordinator = coordinator.before(successor);
        }
        let _guard = runtime.enter();
        for t in tasks {
            runtime.spawn(t);
        }
        runtime.spawn(coordinator.run(event_rx, out_tx, cancel.clone()));
        let handle = Epoch {
            runtime: runtime.handle().clone(),
            epoch,
            planned: batch_plan
                .samples
                .saturating_sub(first_batch * u64::from(s.batch_size)),
            batches: batch_plan.batches,
            first_batch,
            rx: out_rx,
            cancel,
            counters,
            progress: self.progress.clone(),
            pass: 0,
            stats: self.stats.clone(),
            done: false,
            pending_wait: Duration::ZERO,
            ring_batches: s.ring_batches,
            seen: (0, 0, None),
            carried: Vec::new(),
            settings_only: true,
        };
        Ok(Started {
            epoch: handle,
            progress,
            links: names,
            next,
        })
    }

    /// Each worker name as its socket addresses (a DNS name may give several).
    fn resolve(&self, names: &[String]) -> Result<Vec<(String, SocketAddr)>, ClientError> {
        use std::net::ToSocketAddrs;
        let mut out = Vec::new();
        for name in names {
            let addrs: Vec<SocketAddr> = name
                .to_socket_addrs()
                .map_err(|e| ClientError::Resolve {
                    worker: name.clone(),
                    detail: e.to_string(),
                })?
                .filter(|a| a.is_ipv4())
                .collect();
            if addrs.is_empty() {
                return Err(ClientError::Resolve {
                    worker: name.clone(),
                    detail: "resolves to no IPv4 address".into(),
                });
            }
            let many = addrs.len() > 1;
            for a in addrs {
                let label = if many {
                    format!("{name} ({a})")
                } else {
                    name.clone()
                };
                out.push((label, a));
            }
        }
        Ok(out)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        // Dropping a runtime blocks on its threads, which panics inside another runtime's
        // async context (a user's tokio task): let it wind down in the background instead.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// The first `samples` samples of `units`, ids renumbered in order.
fn cut_units(units: Vec<WorkUnit>, samples: u64) -> Vec<WorkUnit> {
    let mut left = samples;
    let mut out = Vec::with_capacity(units.len());
    for mut u in units {
        if left == 0 {
            break;
        }
        if u.len() > left {
            u.end = u.start + left;
        }
        left -= u.len();
        u.id = out.len() as u32;
        out.push(u);
    }
    out
}

/// The samples at positions `done..` of `sequence`, as pieces: per unit (in unit order),
/// runs of consecutive indexes.
fn remaining_pieces(
    units: &[WorkUnit],
    sequence: &Sequence,
    done: u64,
) -> Vec<sluice_plan::assign::Piece> {
    let mut left: Vec<Vec<u64>> = vec![Vec::new(); units.len()];
    for p in done..sequence.len() {
        if let Some((u, i)) = sequence.at(p) {
            left[u as usize].push(i);
        }
    }
    let mut out: Vec<sluice_plan::assign::Piece> = Vec::new();
    for (u, mut idx) in units.iter().zip(left) {
        idx.sort_unstable();
        for i in idx {
            match out.last_mut() {
                Some(p) if p.shard == u.shard && p.end == i && p.padding == u.padding => p.end += 1,
                _ => out.push(sluice_plan::assign::Piece {
                    shard: u.shard,
                    start: i,
                    end: i + 1,
                    padding: u.padding,
                }),
            }
        }
    }
    out
}

/// How long the consumer may wait on a full ring (another thread may still release a batch)
/// before the epoch fails with [`ClientError::RingExhausted`].
const RING_DEADLOCK_GRACE: Duration = Duration::from_secs(5);

/// One epoch's batches, in the order they are completed. Dropping it cancels the epoch.
pub struct Epoch {
    runtime: tokio::runtime::Handle,
    epoch: u64,
    planned: u64,
    batches: u64,
    /// The index of the first batch it yields (a resumed epoch starts past 0).
    first_batch: u64,
    rx: mpsc::Receiver<Result<Batch, ClientError>>,
    cancel: CancellationToken,
    counters: Arc<EpochCounters>,
    progress: Arc<Mutex<Option<Progress>>>,
    /// Which of the loader's passes this is: its batches are checkpointed while it is the
    /// recorded one (see [`Progress`]).
    pass: u64,
    stats: Arc<Stats>,
    done: bool,
    /// Waiting done by `next_timeout` calls that timed out, charged to the next batch.
    pending_wait: Duration,
    ring_batches: usize,
    /// Samples delivered and skipped so far, and the first skip's reason: an epoch that
    /// skipped every sample ends with an error, not quietly after empty batches.
    seen: (u64, u64, Option<String>),
    /// Skips of batches not handed out (every sample skipped), reported with the next one.
    carried: Vec<(crate::batch::SampleId, String)>,
    /// Every skip so far was a setting the data cannot satisfy (see [`a_setting`]).
    settings_only: bool,
}

impl Epoch {
    /// What the epoch has delivered so far.
    pub fn report(&self) -> EpochReport {
        self.counters.report(self.epoch, self.planned)
    }

    /// Batches this epoch has in all (the same on every rank).
    pub fn batches(&self) -> u64 {
        self.batches
    }

    /// Batches this epoch yields: all of them, or after a resume the rest.
    pub fn batches_left(&self) -> u64 {
        self.batches.saturating_sub(self.first_batch)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Skips of the epoch's last batches, which were not handed out because every sample of
    /// them was skipped (earlier ones ride with the next batch handed out): with the batches'
    /// own `skipped`, every skip of the epoch, once.
    pub fn unbatched_skips(&self) -> &[(crate::batch::SampleId, String)] {
        &self.carried
    }

    fn record(&self, batch: &Batch, waited: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let padded = batch.padding().iter().filter(|p| **p).count() as u64;
        let real = batch.len() as u64 - padded;
        self.counters.delivered.fetch_add(real, Relaxed);
        self.counters.padded.fetch_add(padded, Relaxed);
        self.counters
            .skipped
            .fetch_add(batch.skipped().len() as u64, Relaxed);
        self.counters.batches.fetch_add(1, Relaxed);
        self.counters
            .starved_ns
            .fetch_add(waited.as_nanos() as u64, Relaxed);
        self.stats.batch(batch.len() as u64, waited);
        if let Ok(mut p) = self.progress.lock() {
            if let Some(p) = p.as_mut().filter(|p| p.pass == self.pass) {
                p.batches += 1;
                for &(unit, shard, index) in &batch.accounted {
                    p.ledger.record(unit, shard, index);
                }
                p.open = p.batches < self.batches;
            }
        }
    }

    /// This pass hands out nothing more: another may become the recorded one.
    fn close(&mut self) {
        self.done = true;
        if let Ok(mut p) = self.progress.lock() {
            if let Some(p) = p.as_mut().filter(|p| p.pass == self.pass) {
                p.open = false;
            }
        }
    }
}

impl Epoch {
    /// Like `next`, but gives up after `timeout` (`Err(())`), so a caller can check for
    /// interruptions (Ctrl-C in Python) while it waits. The wait counts as starvation.
    #[allow(clippy::result_unit_err)]
    pub fn next_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Result<Batch, ClientError>>, ()> {
        if self.done {
            return Ok(None);
        }
        let started = Instant::now();
        let waiting = &self.counters.consumer_waiting;
        waiting.store(true, std::sync::atomic::Ordering::Relaxed);
        let item = self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, self.rx.recv()).await });
        waiting.store(false, std::sync::atomic::Ordering::Relaxed);
        let waited = started.elapsed();
        match item {
            Err(_) => {
                self.pending_wait += waited;
                // The consumer waits for a batch while the coordinator waits for the consumer
                // to free a buffer: nothing can move unless another thread drops a batch.
                let ring_full = self
                    .counters
                    .ring_full
                    .load(std::sync::atomic::Ordering::Relaxed);
                if ring_full && self.pending_wait >= RING_DEADLOCK_GRACE {
                    self.close();
                    self.cancel.cancel();
                    return Ok(Some(Err(ClientError::RingExhausted {
                        ring_batches: self.ring_batches,
                    })));
                }
                Err(())
            }
            Ok(item) => match self.finish_next(item, waited) {
                Some(next) => Ok(next),
                // A batch of skips only: not handed out, so the caller waits on.
                None => Err(()),
            },
        }
    }

    /// What the consumer gets for `item`; `None` for a batch whose every sample was skipped,
    /// which is recorded (its place in the epoch is taken) but never handed to a training loop.
    fn finish_next(
        &mut self,
        item: Option<Result<Batch, ClientError>>,
        waited: Duration,
    ) -> Option<Option<Result<Batch, ClientError>>> {
        let waited = waited + std::mem::take(&mut self.pending_wait);
        Some(match item {
            Some(Ok(batch)) => {
                self.record(&batch, waited);
                let real = batch.padding().iter().filter(|p| !**p).count() as u64;
                self.seen.0 += real;
                self.seen.1 += batch.skipped().len() as u64;
                if self.seen.2.is_none() {
                    self.seen.2 = batch.skipped().first().map(|(_, why)| why.clone());
                }
                self.settings_only &= batch.skipped().iter().all(|(_, why)| a_setting(why));
                if !batch.is_empty() {
                    let mut batch = batch;
                    if !self.carried.is_empty() {
                        // Skips of batches not handed out are reported with this one.
                        let mut skipped = std::mem::take(&mut self.carried);
                        skipped.append(&mut batch.skipped);
                        batch.skipped = skipped;
                    }
                    return Some(Some(Ok(batch)));
                }
                let early = self.seen.0 == 0 && self.seen.1 >= FAIL_FAST_SKIPS.min(self.planned);
                if early && self.settings_only {
                    self.close();
                    self.cancel.cancel();
                    return Some(Some(Err(ClientError::FirstSamplesSkipped {
                        epoch: self.epoch,
                        skipped: self.seen.1,
                        reasons: distinct_reasons(batch.skipped()),
                    })));
                }
                tracing::warn!(
                    epoch = self.epoch,
                    batch = batch.index(),
                    "every one of the batch's {} samples was skipped, so it is not handed out \
                     (its skips come with the next batch); the first: {}",
                    batch.skipped().len(),
                    batch.skipped().first().map_or("", |(_, why)| why.as_str())
                );
                let mut batch = batch;
                self.carried.append(&mut batch.skipped);
                return None;
            }
            Some(Err(e)) => {
                self.close();
                Some(Err(e))
            }
            None => {
                self.close();
                match &self.seen {
                    (0, skipped, Some(first)) if *skipped > 0 => {
                        Some(Err(ClientError::AllSkipped {
                            epoch: self.epoch,
                            skipped: *skipped,
                            first: first.clone(),
                        }))
                    }
                    _ => None,
                }
            }
        })
    }
}

/// Skipped samples after which, with none delivered yet and every one skipped for a setting
/// (see [`a_setting`]), an epoch stops: a label or image field the data does not have
/// (`label="cls"` on data without `.cls`) fails at once, not after an epoch of empty
/// batches. Damaged data never stops an epoch early: a rewritten first shard is skipped.
const FAIL_FAST_SKIPS: u64 = 32;

/// Whether a skip's reason ("key: cause") is one of the loader's settings meeting data that
/// cannot satisfy it (the label, the image field), not damage in the data.
fn a_setting(why: &str) -> bool {
    let cause = why.split_once(": ").map_or(why, |(_, c)| c);
    cause.starts_with("label: ") || cause.starts_with("no image field")
}

/// Up to three distinct reasons among `skipped` (a reason is "key: cause"), each with the
/// first sample it was given for.
fn distinct_reasons(skipped: &[(crate::batch::SampleId, String)]) -> String {
    let cause = |why: &str| why.split_once(": ").map_or(why, |(_, c)| c).to_string();
    let mut reasons: Vec<&str> = Vec::new();
    let mut causes: Vec<String> = Vec::new();
    for (_, why) in skipped {
        if reasons.len() == 3 {
            break;
        }
        if !causes.contains(&cause(why)) {
            causes.push(cause(why));
            reasons.push(why);
        }
    }
    reasons.join("; ")
}

impl Iterator for Epoch {
    type Item = Result<Batch, ClientError>;

    /// Blocks until the next batch. Call it from a plain thread, not from async code.
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Ok(item) = self.next_timeout(Duration::from_millis(500)) {
                return item;
            }
        }
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.close();
    }
}

/// The client's QUIC endpoint: datagrams up to [`sluice_wire::quic::MAX_UDP_PAYLOAD`] and a
/// receive buffer that rides out a descheduled client thread (see
/// [`sluice_wire::quic::SOCKET_BUFFER_BYTES`]). A smaller buffer than asked for only costs
/// speed, so it is logged, not fatal.
fn quic_endpoint(runtime: &tokio::runtime::Runtime) -> Result<quinn::Endpoint, ClientError> {
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        ClientError::Runtime(format!("QUIC endpoint: {what}: {e}"))
    };
    let socket = std::net::UdpSocket::bind(SocketAddr::from(([0, 0, 0, 0], 0)))
        .map_err(|e| failed("bind 0.0.0.0:0", &e))?;
    if let Some(why) = sluice_wire::quic::grow_buffer(&socket, sluice_wire::quic::Buffer::Receive) {
        tracing::debug!("{why}");
    }
    let mut config = quinn::EndpointConfig::default();
    config
        .max_udp_payload_size(sluice_wire::quic::MAX_UDP_PAYLOAD)
        .map_err(|e| failed("datagram size", &e))?;
    // quinn registers the socket with the runtime it is created on.
    let _entered = runtime.enter();
    quinn::Endpoint::new(
        config,
        None,
        socket,
        std::sync::Arc::new(quinn::TokioRuntime),
    )
    .map_err(|e| failed("start", &e))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use sluice_shard::{Checksum, Compression, ShardInfo};

    use super::*;

    /// A worker in process whose tensors are one byte, the sample's index; it logs the epoch
    /// of every unit it runs.
    struct Tiny {
        runs: Arc<Mutex<Vec<u64>>>,
        /// An epoch whose first job is refused.
        refuse: Mutex<Option<u64>>,
    }

    struct TinyJob {
        epoch: u64,
        runs: Arc<Mutex<Vec<u64>>>,
    }

    const TINY: sluice_wire::SampleShape = sluice_wire::SampleShape {
        height: 1,
        width: 1,
        channels: 1,
        elem_bytes: 1,
        chw: false,
    };

    impl UnitRunner for Tiny {
        fn open_job(
            &self,
            spec: &JobSpec,
        ) -> Result<Box<dyn sluice_wire::JobRunner>, sluice_wire::RunnerError> {
            let mut refuse = self.refuse.lock().unwrap();
            if *refuse == Some(spec.epoch) {
                *refuse = None;
                return Err(sluice_wire::RunnerError::refused("not now"));
            }
            Ok(Box::new(TinyJob {
                epoch: spec.epoch,
                runs: self.runs.clone(),
            }))
        }
        fn threads(&self) -> u32 {
            1
        }
    }

    impl sluice_wire::JobRunner for TinyJob {
        fn shape(&self) -> sluice_wire::SampleShape {
            TINY
        }
        fn run(
            &self,
            a: &sluice_wire::Assign,
            emit: &mut dyn FnMut(sluice_wire::Output) -> bool,
        ) -> Result<sluice_wire::Finished, sluice_wire::RunnerError> {
            self.runs.lock().unwrap().push(self.epoch);
            crate::testing::emit_unit(a, emit, |index| (0, vec![index as u8]))
        }
    }

    /// Counts the buffers it makes.
    struct Counting(Arc<std::sync::atomic::AtomicUsize>);

    impl HostAllocator for Counting {
        fn allocate(&self, bytes: usize) -> Result<Box<dyn crate::batch::HostMemory>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            HeapAllocator.allocate(bytes)
        }
    }

    type Tiniest = (
        Loader,
        Arc<Mutex<Vec<u64>>>,
        Arc<std::sync::atomic::AtomicUsize>,
    );

    /// Shards `file:///tiny-{i}.tar` of these sample counts (never opened: [`Tiny`] makes the
    /// samples).
    fn tiny_manifest(samples: &[u64]) -> Manifest {
        Manifest::new(
            samples
                .iter()
                .enumerate()
                .map(|(i, &samples)| ShardInfo {
                    url: format!("file:///tiny-{i}.tar"),
                    size: 1 << 20,
                    samples,
                    checksum: Checksum(0),
                    compression: Compression::None,
                    replicas: Vec::new(),
                })
                .collect(),
        )
    }

    impl Tiny {
        /// A worker whose runs nobody looks at and that refuses nothing.
        fn idle() -> Arc<Self> {
            Arc::new(Tiny {
                runs: Arc::default(),
                refuse: Mutex::new(None),
            })
        }
    }

    fn tiny_loader(prefetch: bool) -> Tiniest {
        tiny_loader_refusing(prefetch, None)
    }

    /// A loader of 400 one-byte samples decoded by [`Tiny`], the log of its runs, and the
    /// count of ring buffers it made.
    fn tiny_loader_refusing(prefetch: bool, refuse: Option<u64>) -> Tiniest {
        let manifest = tiny_manifest(&[100; 4]);
        let runs = Arc::new(Mutex::new(Vec::new()));
        let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let loader = Loader::builder()
            .dataset(manifest)
            .in_process(Arc::new(Tiny {
                runs: runs.clone(),
                refuse: Mutex::new(refuse),
            }))
            .batch_size(16)
            .max_unit_samples(20)
            .lookahead(64)
            .ring_batches(2)
            .seed(5)
            .allocator(Arc::new(Counting(made.clone())))
            .prefetch_next_epoch(prefetch)
            .build()
            .unwrap();
        (loader, runs, made)
    }

    fn ids(epoch: Epoch) -> Vec<(u32, u64)> {
        read(epoch, Vec::new()).0
    }

    /// The epoch's sample ids, read as a Python loop reads it: `before` (batches of the epoch
    /// before) is let go once the first batch has come, and the last batch is still held at
    /// the end.
    fn read(epoch: Epoch, mut before: Vec<Batch>) -> (Vec<(u32, u64)>, Vec<Batch>) {
        let mut ids = Vec::new();
        let mut last = Vec::new();
        let e = epoch.epoch();
        for b in epoch {
            let b = b.unwrap_or_else(|err| panic!("epoch {e} after {} samples: {err}", ids.len()));
            before.clear();
            ids.extend(b.ids().iter().map(|i| (i.shard, i.index)));
            last = vec![b];
        }
        (ids, last)
    }

    #[test]
    fn the_next_epoch_starts_early_in_the_same_ring_and_delivers_the_same_batches() {
        let (plain, plain_runs, plain_made) = tiny_loader(false);
        let (early, runs, made) = tiny_loader(true);
        let mut held = Vec::new();
        let mut expected = Vec::new();
        for e in 0..3 {
            let (ids, last) = read(plain.epoch(e).unwrap(), held);
            expected.push(ids);
            held = last;
        }
        assert!(!plain_runs.lock().unwrap().is_empty());
        assert!(
            plain_made.load(std::sync::atomic::Ordering::Relaxed) > 2,
            "without an early start, each epoch makes its own ring"
        );
        let mut held = Vec::new();
        for (e, want) in expected.iter().enumerate() {
            let e = e as u64;
            let (got, last) = read(early.epoch(e).unwrap(), held);
            held = last;
            assert_eq!(&got, want, "epoch {e} started early differs");
            assert_eq!(got.len(), 400);
            // The epoch after this one started without being asked for.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !runs.lock().unwrap().contains(&(e + 1)) {
                assert!(
                    Instant::now() < deadline,
                    "epoch {} never started early",
                    e + 1
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert_eq!(
            made.load(std::sync::atomic::Ordering::Relaxed),
            2,
            "epochs started early share the ring (2 buffers)"
        );
        drop(held);
        // A consumer that keeps every buffer of the ring from the epoch before still gets the
        // next one: the shared ring grows (up to twice its size, what a ring of its own costs).
        let mut kept = Vec::new();
        for b in early.epoch(3).unwrap() {
            kept.push(b.unwrap());
            if kept.len() > 2 {
                kept.remove(0);
            }
        }
        let (got, _) = read(early.epoch(4).unwrap(), Vec::new());
        drop(kept);
        assert_eq!(got, ids(plain.epoch(4).unwrap()));
        // Another epoch than the next one: the early one is dropped, this one is as planned.
        assert_eq!(ids(early.epoch(7).unwrap()), ids(plain.epoch(7).unwrap()));
        // A loaded checkpoint is resumed, not the epoch started early.
        let mut partial = early.epoch(8).unwrap();
        let first = partial.next().unwrap().unwrap();
        let firsts: Vec<_> = first.ids().iter().map(|i| (i.shard, i.index)).collect();
        drop(first);
        let checkpoint = early.state_dict().unwrap();
        drop(partial);
        let (fresh, _, _) = tiny_loader(true);
        fresh.load_state_dict(checkpoint).unwrap();
        let rest = ids(fresh.epoch(8).unwrap());
        let whole = ids(plain.epoch(8).unwrap());
        assert_eq!([firsts, rest].concat(), whole);
    }

    #[test]
    fn an_epoch_read_again_starts_nothing_early() {
        let (l, _, _) = tiny_loader(true);
        let first = ids(l.epoch(3).unwrap());
        assert!(l.next.lock().unwrap().is_some(), "epoch 4 started early");
        let again = l.epoch(3).unwrap();
        assert!(
            l.next.lock().unwrap().is_none(),
            "epoch 3 again: epoch 4 is not started (an evaluation loop would waste it)"
        );
        assert_eq!(ids(again), first);
        let next = l.epoch(4).unwrap();
        assert!(
            l.next.lock().unwrap().is_some(),
            "in order again: epoch 5 is"
        );
        drop(next);
    }

    #[test]
    fn an_early_epoch_that_failed_is_started_anew_when_asked_for() {
        let (plain, _, _) = tiny_loader(false);
        let (early, _, _) = tiny_loader_refusing(true, Some(1));
        assert_eq!(ids(early.epoch(0).unwrap()), ids(plain.epoch(0).unwrap()));
        // Epoch 1, started early, was refused; asked for, it starts again and succeeds.
        let failed = || {
            let next = early.next.lock().unwrap();
            let e = next.as_ref().unwrap();
            e.started.epoch.counters.failed.load(Ordering::Relaxed)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !failed() {
            assert!(Instant::now() < deadline, "the refusal never came");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(ids(early.epoch(1).unwrap()), ids(plain.epoch(1).unwrap()));
    }

    #[test]
    fn connections_per_worker_is_bounded_and_named_in_the_error() {
        let manifest = tiny_manifest(&[64]);
        for n in [0, 17] {
            let built = Loader::builder()
                .dataset(manifest.clone())
                .workers(["127.0.0.1:7100"])
                .trust_cert("/nonexistent/cert.pem")
                .connections_per_worker(n)
                .build();
            match built {
                Err(ClientError::Config { key, .. }) => assert_eq!(key, "connections_per_worker"),
                Err(e) => panic!("{n}: {e}"),
                Ok(_) => panic!("{n} connections were accepted"),
            }
        }
    }

    /// A pass of the epoch begun while the training pass is read (a peek) is not
    /// checkpointed: the checkpoint is still the training pass's batches, and it resumes to
    /// exactly the rest of the epoch. A peek before the training pass starts leaves nothing.
    #[test]
    fn a_peek_does_not_spoil_the_checkpoint() {
        let (loader, _, _) = tiny_loader(false);
        let all = ids(loader.epoch(0).unwrap());
        // Peeked before the pass, and dropped (as `next(iter(loader))` is).
        let peeked = loader.epoch(0).unwrap().next().unwrap().unwrap();
        drop(peeked);
        let mut train = loader.epoch(0).unwrap();
        let mut seen = Vec::new();
        for i in 0..6 {
            let b = train.next().unwrap().unwrap();
            seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
            drop(b);
            if i == 2 {
                // Peeked in the middle, and kept while the pass goes on.
                let mut peek = loader.epoch(0).unwrap();
                let first = peek.next().unwrap().unwrap();
                assert_eq!(first.ids()[0], all_first(&all));
                let state = loader.state_dict().unwrap();
                assert_eq!(state.batches, 3, "the peek was checkpointed");
                drop(first);
                let b = train.next().unwrap().unwrap();
                seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
                drop(peek);
            }
        }
        let state = loader.state_dict().unwrap();
        assert_eq!(state.batches, 7);
        drop(train);
        let (resumed, _, _) = tiny_loader(false);
        resumed.load_state_dict(state).unwrap();
        let rest = ids(resumed.epoch(0).unwrap());
        seen.extend(rest);
        assert_eq!(seen, all, "the resumed epoch is not exactly the rest");
    }

    /// Lightning and Accelerate save rank 0's state only: in plan order it resumes every rank
    /// at its own place, exactly the rest of what that rank would have been handed; in arrival
    /// order it is refused, naming the fix.
    #[test]
    fn one_ranks_checkpoint_resumes_every_rank() {
        let manifest = tiny_manifest(&[37, 41, 29, 53]);
        let builder = |rank: u32, order: Order| {
            Loader::builder()
                .dataset(manifest.clone())
                .in_process(Tiny::idle())
                .batch_size(8)
                .max_unit_samples(9)
                .seed(11)
                .rank(rank)
                .world_size(2)
                .order(order)
                .prefetch_next_epoch(false)
        };
        let mut state0 = None;
        for rank in 0..2 {
            let loader = builder(rank, Order::Plan).build().unwrap();
            let all = ids(loader.epoch(1).unwrap());
            let mut epoch = loader.epoch(1).unwrap();
            let mut seen = Vec::new();
            for _ in 0..4 {
                let b = epoch.next().unwrap().unwrap();
                seen.extend(b.ids().iter().map(|i| (i.shard, i.index)));
            }
            if rank == 0 {
                state0 = loader.state_dict();
            }
            drop(epoch);
            let resumed = builder(rank, Order::Plan).build().unwrap();
            let state = state0.clone().unwrap();
            assert_eq!(state.rank, 0);
            resumed.load_state_dict(state).unwrap();
            seen.extend(ids(resumed.epoch(1).unwrap()));
            assert_eq!(seen, all, "rank {rank} did not resume exactly the rest");
        }
        let arrival = builder(1, Order::Arrival).build().unwrap();
        let mut state = state0.unwrap();
        state.order = Order::Arrival;
        let err = arrival.load_state_dict(state).unwrap_err().to_string();
        assert!(err.contains("save every rank's state_dict"), "{err}");
    }

    fn all_first(all: &[(u32, u64)]) -> crate::batch::SampleId {
        crate::batch::SampleId {
            shard: all[0].0,
            index: all[0].1,
        }
    }

    /// `none`: manifest order, whatever the mixing asked for; arrival order is refused.
    #[test]
    fn shuffle_none_delivers_the_manifest_in_order() {
        let manifest = tiny_manifest(&[25, 26, 27, 28]);
        let builder = |rank: u32| {
            Loader::builder()
                .dataset(manifest.clone())
                .in_process(Tiny::idle())
                .batch_size(8)
                .max_unit_samples(7)
                .shuffle(ShufflePolicy::Sequential)
                .remainder(Remainder::Pad)
                .last_batch(LastBatch::Partial)
                .world_size(3)
                .rank(rank)
        };
        let in_order: Vec<(u32, u64)> = (0..4u32)
            .flat_map(|s| (0..25 + u64::from(s)).map(move |i| (s, i)))
            .collect();
        let mut real = Vec::new();
        for rank in 0..3 {
            let loader = builder(rank).seed(u64::from(rank) + 9).build().unwrap();
            for e in 0..2 {
                let mut got = Vec::new();
                for b in loader.epoch(e).unwrap() {
                    let b = b.unwrap();
                    for (id, pad) in b.ids().iter().zip(b.padding()) {
                        if !pad {
                            got.push((id.shard, id.index));
                        }
                    }
                }
                if e == 0 {
                    real.extend(got.clone());
                } else {
                    assert_eq!(&real[real.len() - got.len()..], &got[..], "epoch 1 differs");
                }
            }
        }
        assert_eq!(real, in_order);
        match builder(0).order(Order::Arrival).build() {
            Err(ClientError::Config { key, .. }) => assert_eq!(key, "order"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("arrival order was accepted with shuffle none"),
        }
    }

    /// A pipeline workers would refuse is refused when the loader is built, named.
    #[test]
    fn a_pipeline_workers_would_refuse_is_a_config_error() {
        for (pipeline, says) in [
            ("decode | hflip 2.0", "hflip"),
            ("decode | resize 40", "output size is not fixed"),
            ("decode | resize 16384x16384", "largest frame"),
        ] {
            let built = Loader::builder()
                .dataset(tiny_manifest(&[64]))
                .in_process(Tiny::idle())
                .pipeline(pipeline.to_string())
                .build();
            match built {
                Err(ClientError::Config { key, detail }) => {
                    assert_eq!(key, "pipeline");
                    assert!(detail.contains(says), "{pipeline}: {detail}");
                }
                Err(e) => panic!("{pipeline}: {e}"),
                Ok(_) => panic!("{pipeline} was accepted"),
            }
        }
    }

    /// A checkpoint names the dataset by its shards' content, not their URLs: it resumes on
    /// the same shards served from elsewhere (another directory, a storage node), and a
    /// changed shard is named in the refusal.
    #[test]
    fn checkpoints_follow_the_shards_content_not_their_urls() {
        let manifest = |base: &str, checksum_of_2: u64| {
            Manifest::new(
                (0..4)
                    .map(|i| ShardInfo {
                        url: format!("{base}/tiny-{i}.tar"),
                        size: 1 << 20,
                        samples: 100,
                        checksum: Checksum(if i == 2 { checksum_of_2 } else { i }),
                        compression: Compression::None,
                        replicas: Vec::new(),
                    })
                    .collect(),
            )
        };
        let loader = |m: Manifest| {
            Loader::builder()
                .dataset(m)
                .in_process(Tiny::idle())
                .batch_size(16)
                .seed(5)
                .build()
                .unwrap()
        };
        let first = loader(manifest("file:///data", 2));
        let mut epoch = first.epoch(0).unwrap();
        let mut before: Vec<(u32, u64)> = Vec::new();
        for _ in 0..3 {
            let b = epoch.next().unwrap().unwrap();
            before.extend(b.ids().iter().map(|i| (i.shard, i.index)));
        }
        let state = first.state_dict().unwrap();
        assert_eq!(state.shards.len(), 4);
        drop(epoch);

        let moved = loader(manifest("http://storage-7:7000/v1/train", 2));
        moved.load_state_dict(state.clone()).unwrap();
        let rest = ids(moved.epoch(0).unwrap());
        let mut all: Vec<_> = before.iter().chain(&rest).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(
            (before.len() + rest.len(), all.len()),
            (400, 400),
            "exactly the rest"
        );

        let changed = loader(manifest("file:///data", 99));
        let err = changed.load_state_dict(state).unwrap_err().to_string();
        assert!(err.contains("shard #2 (file:///data/tiny-2.tar)"), "{err}");
    }

    /// Any batch size works in plan order with the default lookahead (it was a fixed 512, so
    /// `--batch-size 513` failed); one set explicitly below the batch size is still refused.
    #[test]
    fn the_default_lookahead_follows_the_batch_size() {
        let manifest = Manifest::new(vec![ShardInfo {
            url: "file:///nowhere.tar".into(),
            size: 1 << 30,
            samples: 4096,
            checksum: Checksum(0),
            compression: Compression::None,
            replicas: Vec::new(),
        }]);
        let tiny = Tiny::idle();
        let build = |batch: u32, lookahead: Option<u64>| {
            let b = Loader::builder()
                .dataset(manifest.clone())
                .in_process(tiny.clone())
                .batch_size(batch);
            match lookahead {
                Some(l) => b.lookahead(l),
                None => b,
            }
            .build()
        };
        for batch in [1, 256, 513, 2048] {
            let loader = build(batch, None).unwrap_or_else(|e| panic!("batch {batch}: {e}"));
            assert_eq!(loader.settings.lookahead, 512.max(2 * u64::from(batch)));
        }
        match build(513, Some(100)) {
            Err(ClientError::Config { key, .. }) => assert_eq!(key, "lookahead"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a lookahead under the batch size was accepted"),
        }
    }
}
