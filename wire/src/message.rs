//! The messages a client and a CPU worker exchange. Only these small headers are serialized
//! (bincode, behind [`crate::codec`]); a sample's tensor and fields travel as the frame's raw
//! payload, right after its header.
//!
//! Every message that concerns a sample carries (job, unit, attempt) next to the sample's
//! (shard, index), so the client can decide from the frame alone whether it is planned for
//! this rank and epoch and not yet delivered, whichever attempt sent it.

use serde::{Deserialize, Serialize};

use crate::fields::{FieldSelection, LabelSource, SampleGeometry};

/// A message header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Message {
    /// Client → worker, first on a connection: who it is and the cluster token.
    Hello(Hello),
    /// Worker → client: the token was accepted.
    Welcome(Welcome),
    /// Client → worker: run a job's units with this pipeline.
    OpenJob(JobSpec),
    /// Worker → client: the job is open; every sample of it has this shape.
    /// `weight`: the weight the job runs at, after the worker's and its tenant's caps.
    JobOpened {
        job: u64,
        shape: SampleShape,
        weight: u32,
    },
    /// Client → worker: process a sample range of a shard.
    Assign(Assign),
    /// Client → worker: room for this many more samples of a job.
    Credit { job: u64, samples: u32 },
    /// Worker → client: one sample; the payload is the tensor, then each field's bytes.
    Sample(SampleHeader),
    /// Worker → client: a sample the decoder rejected (counted and named, never dropped).
    Skipped(SkippedSample),
    /// Worker → client: every sample of an assignment was sent or skipped.
    UnitDone(UnitDone),
    /// Worker → client: an assignment could not finish (the client reassigns the rest).
    UnitFailed(UnitFailed),
    /// Either way: I am alive.
    Heartbeat { seq: u64 },
    /// Client → worker: stop a job and free what it holds.
    Cancel { job: u64 },
    /// Either way: a refusal or a fatal problem; the sender closes the connection after it.
    Error(ErrorMessage),
    /// Client → worker, same-host transport only: the job's sample slots live in a
    /// shared-memory segment whose descriptor follows this frame on the Unix socket.
    ShmAttach(ShmAttach),
    /// Worker → client: the segment is mapped and matches what was announced.
    ShmAttached { job: u64 },
    /// Client → worker, same-host transport: these slots are free, one credit each.
    SlotCredit { job: u64, slots: Vec<u32> },
    /// Worker → client, same-host transport: a sample whose tensor is in `slot` of the
    /// segment; the payload carries only the fields.
    ShmSample { slot: u32, header: SampleHeader },
    /// Client → worker, same-host transport with a batch arena: write these samples straight
    /// into their places in the client's batches.
    ShmPlaces { job: u64, places: Vec<Place> },
    /// Worker → client, same-host transport: a sample whose tensor is in its `place` of the
    /// batch arena. It spends no credit (the place bounds it; the worker gives the credit
    /// it took back); the payload carries the fields.
    ShmPlaced { place: u32, header: SampleHeader },
    /// Worker → client, same-host transport, after the client cancelled a job: no sample of
    /// it is being or will be written into the batch arena.
    ShmReleased { job: u64 },
}

impl Message {
    /// The message's name, for errors and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::Welcome(_) => "Welcome",
            Message::OpenJob(_) => "OpenJob",
            Message::JobOpened { .. } => "JobOpened",
            Message::Assign(_) => "Assign",
            Message::Credit { .. } => "Credit",
            Message::Sample(_) => "Sample",
            Message::Skipped(_) => "Skipped",
            Message::UnitDone(_) => "UnitDone",
            Message::UnitFailed(_) => "UnitFailed",
            Message::Heartbeat { .. } => "Heartbeat",
            Message::Cancel { .. } => "Cancel",
            Message::Error(_) => "Error",
            Message::ShmAttach(_) => "ShmAttach",
            Message::ShmAttached { .. } => "ShmAttached",
            Message::SlotCredit { .. } => "SlotCredit",
            Message::ShmSample { .. } => "ShmSample",
            Message::ShmPlaces { .. } => "ShmPlaces",
            Message::ShmPlaced { .. } => "ShmPlaced",
            Message::ShmReleased { .. } => "ShmReleased",
        }
    }

    /// The payload length this header announces (only samples carry one).
    pub fn payload_len(&self) -> u64 {
        match self {
            Message::Sample(h) => h.payload_len(),
            Message::ShmSample { header, .. } | Message::ShmPlaced { header, .. } => {
                header.fields_len()
            }
            _ => 0,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub token: String,
    /// A name for logs (host, process, rank).
    pub client: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// A name for logs.
    pub worker: String,
    /// Decode threads: the client may size its assignments by it.
    pub threads: u32,
    /// It keeps a shard cache: the client sends each shard's units to the worker that owns
    /// it (see the client's shard affinity).
    pub caches: bool,
}

impl Welcome {
    /// What a worker called `worker` says, with no threads or cache to tell of (tests and
    /// simulations).
    pub fn named(worker: &str) -> Welcome {
        Welcome {
            worker: worker.into(),
            ..Welcome::default()
        }
    }
}

/// What samples are decoded for: the job's coordinates seed every augmentation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Chosen by the client, unique on its connection.
    pub job: u64,
    /// A name for logs (the manifest's location).
    pub dataset: String,
    /// The pipeline spec (`decode | random_resized_crop 224 | hflip 0.5`).
    pub pipeline: String,
    pub seed: u64,
    pub epoch: u64,
    pub rank: u32,
    pub world_size: u32,
    pub batch_size: u32,
    /// Skip (and report) undecodable samples, or fail their unit.
    pub fail_on_bad_sample: bool,
    /// The non-image fields sent beside each tensor.
    pub fields: FieldSelection,
    /// Where each sample's label comes from; a sample whose label field is missing or not
    /// an integer is a named skip.
    pub label: LabelSource,
    /// A sent field (or the label's field) longer than this makes its sample a named skip.
    pub max_field_bytes: u64,
    /// The training job this belongs to: every rank and epoch of one job says the same. A
    /// worker shares its decode slots among the jobs it serves by this name, and labels its
    /// per-job metrics with it.
    pub name: String,
    /// The job's share of a busy worker against the others' (1 = an equal share; the worker
    /// caps it at its `limits.max_job_weight`).
    pub weight: u32,
    /// Whether the worker may serve this job tensors it decoded for another job of the same
    /// team whose samples are the same bytes (a sweep: same data, pipeline and seed), and keep
    /// this job's for them. The worker decides what is the same from the job and the sample
    /// bytes themselves; nothing of it crosses the wire. `false` opts the job out both ways.
    pub share: bool,
}

/// The shape of every sample tensor of a job; the pipeline must fix it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleShape {
    /// Frames of a clip (T×H×W×C); 1 for an image.
    pub frames: u32,
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    /// Bytes per element (1 for uint8, 2 for f16, 4 for f32).
    pub elem_bytes: u32,
    /// Channels first (C×H×W) rather than H×W×C.
    pub chw: bool,
}

impl SampleShape {
    /// An image of bytes (uint8), H×W×C: what a pipeline with no `to_float` or `to_chw`
    /// gives.
    pub const fn image_u8(height: u32, width: u32, channels: u32) -> SampleShape {
        SampleShape {
            frames: 1,
            height,
            width,
            channels,
            elem_bytes: 1,
            chw: false,
        }
    }

    pub fn bytes(&self) -> u64 {
        u64::from(self.frames.max(1))
            * u64::from(self.height)
            * u64::from(self.width)
            * u64::from(self.channels)
            * u64::from(self.elem_bytes)
    }
}

/// A shard as a worker must find it: replica URLs and what the manifest says of it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRef {
    /// The shard's index in the manifest (seeds augmentation).
    pub index: u32,
    /// Replica URLs or paths, in order of preference.
    pub urls: Vec<String>,
    pub size: u64,
    pub samples: u64,
    /// xxh3 of the shard file.
    pub checksum: u64,
    pub gzip: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assign {
    pub job: u64,
    /// The work unit's id in the epoch plan.
    pub unit: u64,
    /// Which try of this unit (a reassignment after a worker failure is a new attempt).
    pub attempt: u32,
    pub shard: ShardRef,
    /// Samples `start..end` of the shard.
    pub start: u64,
    pub end: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleHeader {
    pub job: u64,
    pub unit: u64,
    pub attempt: u32,
    pub shard: u32,
    pub index: u64,
    pub key: String,
    pub label: Option<i64>,
    pub tensor_bytes: u64,
    /// Fields passed through (name, byte length), after the tensor in the payload.
    pub fields: Vec<(String, u64)>,
    /// The crop and flip that made the tensor from the source image.
    pub geometry: SampleGeometry,
    /// Every field the sample has (the image's too), when a field asked for by name is not
    /// among them: the client names them to a user whose `fields=` has a typo. Empty
    /// otherwise.
    pub has: Vec<String>,
}

impl SampleHeader {
    pub fn payload_len(&self) -> u64 {
        self.tensor_bytes.saturating_add(self.fields_len())
    }

    /// The bytes of the passed-through fields, after the tensor.
    pub fn fields_len(&self) -> u64 {
        self.fields
            .iter()
            .fold(0u64, |n, (_, len)| n.saturating_add(*len))
    }
}

/// The shared-memory segment of a same-host job: `slots` sample tensors of `slot_bytes`
/// each, back to back. With `places` above 0, a second segment follows the first
/// descriptor: the client's batch arena, `places` tensors of `slot_bytes` (its batches,
/// back to back), where the client may ask for a sample to be written straight into its
/// batch ([`Message::ShmPlaces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShmAttach {
    pub job: u64,
    pub slots: u32,
    pub slot_bytes: u64,
    pub places: u32,
}

/// Where a sample of a same-host job goes: sample `index` of attempt `attempt` of `unit`, into
/// tensor `place` of the batch arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Place {
    pub unit: u64,
    pub attempt: u32,
    pub index: u64,
    pub place: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSample {
    pub job: u64,
    pub unit: u64,
    pub attempt: u32,
    pub shard: u32,
    pub index: u64,
    pub key: String,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitDone {
    pub job: u64,
    pub unit: u64,
    pub attempt: u32,
    pub sent: u64,
    pub skipped: u64,
    /// Bytes of shard data the unit read from the storage tier, and from the worker's shard
    /// cache (the client's cache hit ratio).
    pub storage_bytes: u64,
    pub cached_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitFailed {
    pub job: u64,
    pub unit: u64,
    pub attempt: u32,
    pub error: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// No or a wrong cluster token.
    Unauthorized,
    /// A message that makes no sense here (bad pipeline, unknown job, out of turn).
    BadRequest,
    /// The worker is draining or at its connection limit.
    Unavailable,
    Internal,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMessage {
    pub code: ErrorCode,
    pub message: String,
}

impl std::fmt::Display for ErrorMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

/// The TLS application protocol name of a Sluice QUIC connection: the frames' version (9: a
/// job says whether it shares decodes with its team's sweeps). Every frame's version byte also
/// tells builds of different versions apart, with an error naming both.
pub const ALPN: &[u8] = b"sluice/9";
