//! `sluice` for Python: the GPU client as a PyTorch-style loader.
//!
//! ```python
//! loader = sluice.Loader(dataset="manifest.json", workers=["cpu-0:7100"], batch_size=256,
//!                        token_file="token", trust_cert="cert.pem")
//! for images, labels in loader.epoch(0):
//!     x = torch.from_dlpack(images)   # N×H×W×3 uint8, no copy
//! ```
//!
//! Batches leave through DLPack (`__dlpack__` / `__dlpack_device__`), so `torch.from_dlpack`
//! and `numpy.from_dlpack` wrap the loader's own buffer. Lifetime rule: a batch's buffer
//! returns to the loader's ring only when the Python objects of that batch *and* every tensor
//! made from them are gone; until then it is never overwritten. Holding more batches than
//! `ring_batches` stalls the loader (it has nowhere to put the next one).
//!
//! Epoch `e + 1` starts while epoch `e` drains (`prefetch_next_epoch=True`), in the same
//! ring; pass `epochs=N` (the job reads epochs `0..N`) so the epoch after the last is not
//! started for nothing.
//!
//! With `device="cuda:N"` (a build with the `cuda` feature) the ring is page-locked and each
//! batch is copied to a reused device buffer on the loader's own stream, one batch ahead;
//! `torch.from_dlpack` makes the current stream wait for that copy, and the device buffer is
//! refilled only after the work queued on that stream before the tensor was freed.
//!
//! `fields=["txt", "json"]` (or `"all"`) makes each batch carry those fields beside its tensors
//! (`images.fields`, decoded by extension in the pure-Python package around this module);
//! `label` names where labels come from (`"cls"`, `"json:category_id"`, `None`);
//! `images.geometry` gives each row's crop box and flip.
//!
//! Waiting for data releases the GIL and wakes every 100 ms to let Ctrl-C through. Errors from
//! Rust raise `sluice.SluiceError` (a `RuntimeError`) with the same message; bad arguments
//! raise `ValueError`.

mod dlpack;
mod fork;
mod logs;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_client::{ClientError, LastBatch, ShufflePolicy};

pyo3::create_exception!(sluice, SluiceError, PyRuntimeError);

fn client_error(e: ClientError) -> PyErr {
    match e {
        ClientError::Config { .. } | ClientError::Checkpoint(_) => {
            PyValueError::new_err(e.to_string())
        }
        other => SluiceError::new_err(other.to_string()),
    }
}

/// The dataset `dataset=` names: a local manifest, the http(s) URL of one (a storage node
/// serves it; its relative shard URLs resolve against that URL), or shards as paths, URLs or a
/// brace pattern (described from their `.idx` sidecars where those exist). Shard and replica
/// URLs come out absolute, as `sluice loadgen --dataset` makes them.
fn load_dataset(spec: &str) -> PyResult<sluice_shard::Manifest> {
    let remote = spec.starts_with("http://") || spec.starts_with("https://");
    if !remote && spec.ends_with(".json") && !Path::new(spec).is_file() {
        return Err(PyValueError::new_err(format!(
            "dataset: no manifest at {spec} (make one with sluice shard --manifest or sluice \
             index)"
        )));
    }
    sluice_dataset::locate::dataset(spec)
        .map_err(|e| PyValueError::new_err(format!("dataset: {e}")))
}

fn env_u32(name: &str) -> PyResult<Option<u32>> {
    match std::env::var(name) {
        Ok(v) => v.trim().parse().map(Some).map_err(|_| {
            PyValueError::new_err(format!("environment variable {name}={v:?} is not a number"))
        }),
        Err(_) => Ok(None),
    }
}

/// The token in `path`: its first line, trimmed; an empty one is refused (a worker would
/// refuse it with less to go on).
fn read_token(path: &Path) -> PyResult<String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PyValueError::new_err(format!("token_file {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim();
    if token.is_empty() {
        return Err(PyValueError::new_err(format!(
            "token_file {}: the file's first line is empty (it holds the workers' token)",
            path.display()
        )));
    }
    Ok(token.to_string())
}

/// `shuffle="none"` is for evaluation, where the default `remainder="drop"` leaves samples
/// unscored: say how many, and how to score them all.
fn unscored_warning(py: Python<'_>, loader: &sluice_client::Loader) -> PyResult<()> {
    let (_, world) = loader.rank_and_world();
    let total = loader.manifest().total_samples();
    let planned = loader.samples_per_epoch() * u64::from(world);
    if planned >= total {
        return Ok(());
    }
    let msg = std::ffi::CString::new(format!(
        "shuffle=\"none\" with the default remainder=\"drop\": {} of the dataset's {total} \
         samples are not read at world_size {world}; pass remainder=\"pad\" to score every \
         sample once (padding rows are marked), or remainder=\"drop\" to keep this",
        total - planned
    ))
    .map_err(|e| PyValueError::new_err(e.to_string()))?;
    PyErr::warn(
        py,
        &py.get_type::<pyo3::exceptions::PyUserWarning>(),
        &msg,
        1,
    )
}

/// In-process decode threads when `threads` is not given: this machine's cores shared by the
/// ranks torchrun started on it (`LOCAL_WORLD_SIZE`), at least one each.
fn threads_per_rank() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let local = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1);
    (cores / local).max(1)
}

/// `shuffle=`: `"global"` (the default), `"local"`, `"partial:Q"`, `"none"` (manifest order,
/// for evaluation), `True` (global) or `False` (none).
fn shuffle_policy(shuffle: Option<&Bound<'_, PyAny>>) -> PyResult<ShufflePolicy> {
    let Some(s) = shuffle.filter(|s| !s.is_none()) else {
        return Ok(ShufflePolicy::Global);
    };
    if let Ok(flag) = s.downcast::<pyo3::types::PyBool>() {
        return Ok(if flag.is_true() {
            ShufflePolicy::Global
        } else {
            ShufflePolicy::Sequential
        });
    }
    let text: String = s.extract().map_err(|_| {
        PyValueError::new_err(format!(
            "shuffle: expected \"global\", \"local\", \"partial:Q\" or \"none\", got {s}"
        ))
    })?;
    text.parse()
        .map_err(|e| PyValueError::new_err(format!("shuffle: {e}")))
}

/// A keyword `Loader` does not take: DataLoader habits get the Sluice way of saying them.
fn unknown_keyword(key: &str) -> PyErr {
    let hint = match key {
        "num_workers" | "persistent_workers" | "prefetch_factor" | "worker_init_fn" => {
            "decoding runs in sluice cpu workers (workers=[\"host:port\", ...]) or in this \
             process (threads=N decode threads); there are no DataLoader worker processes"
        }
        "pin_memory" | "pin_memory_device" => {
            "device=\"cuda:N\" keeps the batch ring page-locked and uploads each batch on its \
             own stream; host batches (device=\"cpu\") are ordinary memory"
        }
        "sampler" | "batch_sampler" | "generator" => {
            "Sluice plans each epoch itself: seed=, shuffle=, and rank/world_size (from RANK \
             and WORLD_SIZE by default)"
        }
        "collate_fn" => {
            "batches are already tensors (torch.from_dlpack(images)) with \
             images.keys, images.fields and labels beside them"
        }
        "timeout" => "worker_wait= is how long to wait for a worker (seconds)",
        _ => "",
    };
    let msg = if hint.is_empty() {
        format!("Loader() got an unexpected keyword argument '{key}'")
    } else {
        format!("Loader() takes no '{key}': {hint}")
    };
    pyo3::exceptions::PyTypeError::new_err(msg)
}

/// `fields=`: `None` or `[]` (none), `"all"`, one name, or a list of names.
fn field_selection(fields: Option<&Bound<'_, PyAny>>) -> PyResult<sluice_client::FieldSelection> {
    let names: Vec<String> = match fields {
        None => Vec::new(),
        Some(f) if f.is_none() => Vec::new(),
        Some(f) => match f.extract::<String>() {
            Ok(one) => vec![one],
            Err(_) => f.extract::<Vec<String>>().map_err(|_| {
                PyValueError::new_err(format!(
                    "fields: expected \"all\", a field name or a list of names, got {f}"
                ))
            })?,
        },
    };
    sluice_client::FieldSelection::from_names(&names).map_err(PyValueError::new_err)
}

/// Where batches go: host memory, or a GPU through the uploader.
enum Device {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::Uploader),
}

/// `cpu`, `cuda` or `cuda:N`: `None` for the CPU, else the GPU ordinal.
fn parse_device(device: &str) -> PyResult<Option<usize>> {
    match device {
        "cpu" => Ok(None),
        "cuda" => Ok(Some(0)),
        d => d
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(Some)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "device {d:?}: expected \"cpu\", \"cuda\" or \"cuda:N\""
                ))
            }),
    }
}

/// The on-device conversion `dtype`, `mean` and `std` ask for.
#[cfg(feature = "cuda")]
fn conversion(
    dtype: &str,
    mean: Option<[f32; 3]>,
    std: Option<[f32; 3]>,
) -> PyResult<sluice_client::cuda::Convert> {
    use sluice_client::cuda::Convert;
    let mean = mean.unwrap_or(Convert::IMAGENET_MEAN);
    let std = std.unwrap_or(Convert::IMAGENET_STD);
    if let Some(s) = std.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(PyValueError::new_err(format!(
            "std: every value must be positive, got {s}"
        )));
    }
    Convert::to_dtype(dtype, mean, std).ok_or_else(|| {
        PyValueError::new_err(format!(
            "dtype {dtype:?}: expected \"uint8\", \"float32\" or \"float16\""
        ))
    })
}

/// The GPU side of a loader: the page-locked ring's allocator and the uploader.
#[cfg(feature = "cuda")]
fn open_cuda(
    ordinal: usize,
    dtype: &str,
    mean: Option<[f32; 3]>,
    std: Option<[f32; 3]>,
) -> PyResult<(Arc<dyn sluice_client::HostAllocator>, Device)> {
    use sluice_client::cuda::{Gpu, PinnedAllocator, Uploader};
    let convert = conversion(dtype, mean, std)?;
    let gpu = Gpu::open(ordinal)
        .map_err(|e| SluiceError::new_err(format!("device cuda:{ordinal}: {e}")))?;
    let uploader = Uploader::new(gpu.clone(), convert, 1)
        .map_err(|e| SluiceError::new_err(format!("device cuda:{ordinal}: {e}")))?;
    Ok((Arc::new(PinnedAllocator::new(gpu)), Device::Cuda(uploader)))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    ordinal: usize,
    _dtype: &str,
    _mean: Option<[f32; 3]>,
    _std: Option<[f32; 3]>,
) -> PyResult<(Arc<dyn sluice_client::HostAllocator>, Device)> {
    Err(PyValueError::new_err(format!(
        "device \"cuda:{ordinal}\": this sluice was built without CUDA support; reinstall it with MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python, or take \"cpu\" batches and move them with .to(device)"
    )))
}

/// A loader (or its epoch) used in a child forked from the process that made it.
fn forked(made_in: u32) -> PyErr {
    SluiceError::new_err(format!(
        "this loader was made in process {made_in}, and this is a child forked from it: its \
         threads did not survive the fork. Build the loader in the process that reads it \
         (inside a DataLoader, use DataLoader(loader, batch_size=None) with num_workers=0, or \
         no DataLoader at all: the loader decodes in its own threads or sluice cpu workers)"
    ))
}

/// A field's decoded value may be this many times its stored limit (`max_field_bytes`) unless
/// `max_decoded_bytes` says otherwise: room for compressed arrays, not for a 1 MB `.npz` that
/// is 1 GB of zeros.
const DECODED_PER_STORED: u64 = 8;

/// The Sluice loader. See the module documentation.
#[pyclass(module = "sluice")]
struct Loader {
    /// Torn down only in the process that made it (see [`fork`]).
    inner: fork::ForkSafe<sluice_client::Loader>,
    epoch: Mutex<u64>,
    device: fork::ForkSafe<Device>,
    /// The fields asked for by name (every batch lists them, even where no row has one), and
    /// the decoded size limit.
    requested: Arc<dlpack::Asked>,
    absent: Arc<Absent>,
}

#[pymethods]
impl Loader {
    #[new]
    #[pyo3(signature = (
        dataset, workers=None, batch_size=256, seed=0, rank=None, world_size=None,
        shuffle=None, pipeline="decode | random_resized_crop 224 | hflip 0.5",
        device="cpu", token_file=None, trust_cert=None, threads=None, drop_last=false,
        ring_batches=4, dtype="uint8", mean=None, std=None, order="plan", mix_units=None,
        mix_buffer=None, prefetch_next_epoch=true, epochs=None, fields=None, label=Some("cls"),
        max_field_bytes=1 << 20, remainder=None, same_host="auto", same_host_dir=None,
        connections_per_worker=1, fail_on_bad_sample=false, worker_wait=30.0, hedge_after=3.0,
        max_unit_samples=64, lookahead=None, num_classes=None, allow_negative_labels=false,
        max_decoded_bytes=None, top_up=false, **kwargs,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        dataset: PathBuf,
        workers: Option<&Bound<'_, PyAny>>,
        batch_size: u32,
        seed: u64,
        rank: Option<u32>,
        world_size: Option<u32>,
        shuffle: Option<&Bound<'_, PyAny>>,
        pipeline: &str,
        device: &str,
        token_file: Option<PathBuf>,
        trust_cert: Option<PathBuf>,
        threads: Option<usize>,
        drop_last: bool,
        ring_batches: usize,
        dtype: &str,
        mean: Option<[f32; 3]>,
        std: Option<[f32; 3]>,
        order: &str,
        mix_units: Option<u32>,
        mix_buffer: Option<u32>,
        prefetch_next_epoch: bool,
        epochs: Option<u64>,
        fields: Option<&Bound<'_, PyAny>>,
        label: Option<&str>,
        max_field_bytes: u64,
        remainder: Option<&str>,
        same_host: &str,
        same_host_dir: Option<PathBuf>,
        connections_per_worker: u32,
        fail_on_bad_sample: bool,
        worker_wait: f64,
        hedge_after: f64,
        max_unit_samples: u64,
        lookahead: Option<u64>,
        num_classes: Option<u64>,
        allow_negative_labels: bool,
        max_decoded_bytes: Option<u64>,
        top_up: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        logs::install();
        if let Some(kwargs) = kwargs {
            if let Some((key, _)) = kwargs.iter().next() {
                return Err(unknown_keyword(&key.to_string()));
            }
        }
        // The pipeline first, as a worker will check it: a mistake is a ValueError here.
        sluice_client::check_pipeline(pipeline).map_err(client_error)?;
        let remainder_given = remainder.is_some();
        let remainder: sluice_client::Remainder = remainder
            .unwrap_or("drop")
            .parse()
            .map_err(|e| PyValueError::new_err(format!("remainder: {e}")))?;
        let same_host: sluice_client::SameHost = same_host
            .parse()
            .map_err(|e| PyValueError::new_err(format!("same_host: {e}")))?;
        let seconds = |key: &str, v: f64| {
            if v.is_finite() && v > 0.0 && v < 1e6 {
                Ok(Duration::from_secs_f64(v))
            } else {
                Err(PyValueError::new_err(format!(
                    "{key}: must be a positive number of seconds, got {v}"
                )))
            }
        };
        let worker_wait = seconds("worker_wait", worker_wait)?;
        let hedge_after = seconds("hedge_after", hedge_after)?;
        let workers: Option<Vec<String>> = match workers {
            None => None,
            Some(w) if w.is_none() => None,
            Some(w) => Some(match w.extract::<String>() {
                Ok(one) => vec![one],
                Err(_) => w.extract::<Vec<String>>().map_err(|_| {
                    PyValueError::new_err(format!(
                        "workers: expected \"host:port\" or a list of them, got {w}"
                    ))
                })?,
            }),
        };
        let shuffle = shuffle_policy(shuffle)?;
        let dataset_text = dataset.to_string_lossy().into_owned();
        let fields = field_selection(fields)?;
        let label = match label {
            None => sluice_client::LabelSource::None,
            Some(l) => sluice_client::LabelSource::parse(l).map_err(PyValueError::new_err)?,
        };
        if max_field_bytes == 0 {
            return Err(PyValueError::new_err("max_field_bytes: must be at least 1"));
        }
        if num_classes == Some(0) {
            return Err(PyValueError::new_err("num_classes: must be at least 1"));
        }
        let requested = match &fields {
            sluice_client::FieldSelection::Named(names) => names.clone(),
            _ => Vec::new(),
        };
        let ordinal = parse_device(device)?;
        let order: sluice_client::Order = order
            .parse()
            .map_err(|e| PyValueError::new_err(format!("order: {e}")))?;
        if ordinal.is_none() && (dtype != "uint8" || mean.is_some() || std.is_some()) {
            return Err(PyValueError::new_err(format!(
                "dtype {dtype:?} / mean / std: the conversion runs on the GPU, so it needs device=\"cuda:N\" (on the CPU, convert the uint8 batch yourself)"
            )));
        }
        // The GPU first: a machine without one fails before any worker is contacted.
        let (allocator, sink) = match ordinal {
            None => (None, Device::Cpu),
            Some(n) => {
                let (a, d) = py.allow_threads(|| open_cuda(n, dtype, mean, std))?;
                (Some(a), d)
            }
        };
        let rank = match rank {
            Some(r) => r,
            None => env_u32("RANK")?.unwrap_or(0),
        };
        let world_size = match world_size {
            Some(w) => w,
            None => env_u32("WORLD_SIZE")?.unwrap_or(1),
        };
        let manifest = py.allow_threads(|| load_dataset(&dataset_text))?;
        let mut b = sluice_client::Loader::builder()
            .dataset(manifest)
            .dataset_name(dataset_text.clone())
            .pipeline(pipeline.to_string())
            .batch_size(batch_size)
            .seed(seed)
            .rank(rank)
            .world_size(world_size)
            .shuffle(shuffle)
            .order(order)
            .mixing(sluice_client::Mixing {
                window_units: mix_units.unwrap_or(sluice_client::Mixing::default().window_units),
                buffer_samples: mix_buffer
                    .unwrap_or(sluice_client::Mixing::default().buffer_samples),
            })
            .ring_batches(ring_batches)
            .remainder(remainder)
            .same_host(same_host)
            .connections_per_worker(connections_per_worker)
            .fail_on_bad_sample(fail_on_bad_sample)
            .worker_wait(worker_wait)
            .hedge_after(hedge_after)
            .max_unit_samples(max_unit_samples)
            .fields(fields)
            .label(label)
            .max_field_bytes(max_field_bytes)
            .labels(sluice_client::LabelRange {
                allow_negative: allow_negative_labels,
                num_classes,
            })
            .prefetch_next_epoch(prefetch_next_epoch)
            .short_batch(if top_up {
                sluice_client::ShortBatch::TopUp
            } else {
                sluice_client::ShortBatch::Deliver
            })
            .last_batch(if drop_last {
                LastBatch::Drop
            } else {
                LastBatch::Partial
            });
        if let Some(n) = epochs {
            b = b.epochs(n);
        }
        if let Some(n) = lookahead {
            b = b.lookahead(n);
        }
        if let Some(a) = allocator {
            b = b.allocator(a);
        }
        if let Some(d) = same_host_dir {
            b = b.same_host_dir(d);
        }
        b = match workers {
            None => {
                let engine = sluice_cpu::EngineConfig {
                    threads: threads.unwrap_or_else(threads_per_rank),
                    ..Default::default()
                };
                // The blocking HTTP client inside the source is made off any event loop.
                let worker = py
                    .allow_threads(|| {
                        sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default())
                            .map_err(|e| e.to_string())
                            .and_then(|s| {
                                sluice_cpu::CpuWorker::new(engine, s).map_err(|e| e.to_string())
                            })
                    })
                    .map_err(SluiceError::new_err)?;
                b.in_process(Arc::new(worker))
            }
            Some(list) => {
                let mut b = b.workers(list);
                let token = match token_file {
                    Some(p) => Some(read_token(&p)?),
                    None => std::env::var("SLUICE_TOKEN").ok(),
                };
                if let Some(t) = token {
                    b = b.token(t);
                }
                if let Some(c) = trust_cert {
                    b = b.trust_cert(c);
                }
                b
            }
        };
        let inner = py.allow_threads(|| b.build()).map_err(client_error);
        logs::deliver(py);
        let inner = inner?;
        if shuffle == ShufflePolicy::Sequential && !remainder_given {
            unscored_warning(py, &inner)?;
        }
        Ok(Loader {
            inner: fork::ForkSafe::new(inner),
            epoch: Mutex::new(0),
            device: fork::ForkSafe::new(sink),
            absent: Arc::default(),
            requested: Arc::new(dlpack::Asked {
                names: requested,
                max_decoded_bytes: max_decoded_bytes
                    .unwrap_or(max_field_bytes.saturating_mul(DECODED_PER_STORED)),
            }),
        })
    }

    /// The batches of epoch `epoch` (resuming it when a checkpoint for it was loaded). The
    /// epoch keeps its loader alive: `for b in sluice.Loader(...).epoch(0)` reads it whole.
    fn epoch(slf: &Bound<'_, Self>, epoch: u64) -> PyResult<Epoch> {
        let mut read = slf.borrow().read(slf.py(), epoch)?;
        read.loader = Some(slf.clone().unbind());
        Ok(read)
    }

    /// The epoch plain iteration (`for images, labels in loader`) uses next.
    fn set_epoch(&self, epoch: u64) {
        if let Ok(mut e) = self.epoch.lock() {
            *e = epoch;
        }
    }

    fn __iter__(slf: &Bound<'_, Self>) -> PyResult<Epoch> {
        let epoch = slf.borrow().epoch.lock().map(|e| *e).unwrap_or(0);
        Self::epoch(slf, epoch)
    }

    /// The dataset as this rank sees it: `{"fingerprint": hex, "shards": n, "samples": n,
    /// "rank": r, "world_size": w}`. Every rank of a job must agree on the fingerprint
    /// (the shards' content in manifest order); `sluice.torch` checks it across ranks.
    #[getter]
    fn dataset_identity<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let m = self.inner.manifest();
        d.set_item(
            "fingerprint",
            format!("{:016x}", self.inner.dataset_fingerprint()),
        )?;
        d.set_item("shards", m.shards.len())?;
        d.set_item("samples", m.total_samples())?;
        let (rank, world) = self.inner.rank_and_world();
        d.set_item("rank", rank)?;
        d.set_item("world_size", world)?;
        Ok(d)
    }

    /// Batches per epoch (the same on every rank). For an epoch resumed at another world
    /// size: the batches handed out before the checkpoint plus this rank's share of the rest,
    /// as a training loop that restored its step count counts them.
    fn __len__(&self) -> usize {
        let epoch = self.epoch.lock().map(|e| *e).unwrap_or(0);
        self.inner.batches_in_epoch(epoch) as usize
    }

    /// A checkpoint of the current epoch as a plain dict (save it with the model's).
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(c) = self.inner.state_dict() else {
            return Ok(PyDict::new(py).into_any());
        };
        let text = String::from_utf8_lossy(&c.to_bytes()).into_owned();
        py.import("json")?.call_method1("loads", (text,))
    }

    /// Restores a checkpoint from `state_dict()`; the next `epoch(e)` (or iteration) resumes
    /// it. `state` may also be a list of every rank's state dicts taken at the same step: at
    /// another world size (plan order) the rest of their epoch is split equally across this
    /// job's ranks, and one rank's state is enough.
    fn load_state_dict(&self, py: Python<'_>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        let json = py.import("json")?;
        let states: Vec<Bound<'_, PyAny>> = if state.is_instance_of::<pyo3::types::PyList>() {
            state.try_iter()?.collect::<PyResult<_>>()?
        } else {
            vec![state.clone()]
        };
        // `{}` is what state_dict() gives before the first batch: the start of an epoch,
        // nothing to restore.
        let empty = |s: &Bound<'_, PyAny>| s.downcast::<PyDict>().is_ok_and(|d| d.is_empty());
        if states.iter().all(empty) {
            return Ok(());
        }
        let mut checkpoints = Vec::with_capacity(states.len());
        for s in &states {
            let text: String = json.call_method1("dumps", (s,))?.extract()?;
            checkpoints.push(
                sluice_client::Checkpoint::from_bytes(text.as_bytes()).map_err(client_error)?,
            );
        }
        let epoch = checkpoints.first().map_or(0, |c| c.epoch);
        self.inner
            .load_state_dicts(&checkpoints)
            .map_err(client_error)?;
        self.set_epoch(epoch);
        Ok(())
    }

    /// Live figures: batches, samples, samples_per_s, starved_fraction, workers.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("batches", s.batches)?;
        d.set_item("samples", s.samples)?;
        d.set_item("samples_per_s", s.samples_per_s())?;
        d.set_item("starved_fraction", s.starved_fraction())?;
        let workers: Vec<(String, bool, u64, usize)> = s
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.alive, w.samples, w.in_flight_units))
            .collect();
        d.set_item("workers", workers)?;
        Ok(d)
    }
}

impl Loader {
    /// Starts epoch `epoch` for [`Loader::epoch`].
    fn read(&self, py: Python<'_>, epoch: u64) -> PyResult<Epoch> {
        if let Some(pid) = self.inner.forked_from() {
            return Err(forked(pid));
        }
        if let Ok(mut e) = self.epoch.lock() {
            *e = epoch;
        }
        let inner = py
            .allow_threads(|| self.inner.epoch(epoch))
            .map_err(client_error);
        logs::deliver(py);
        let inner = inner?;
        let inner = match &*self.device {
            Device::Cpu => Batches::Host(inner),
            #[cfg(feature = "cuda")]
            Device::Cuda(u) => Batches::Device(u.epoch(inner)),
        };
        Ok(Epoch {
            inner: fork::ForkSafe::new(Mutex::new(inner)),
            requested: self.requested.clone(),
            absent: self.absent.clone(),
            loader: None,
        })
    }
}

/// An epoch's batches, in host memory or on a GPU.
enum Batches {
    Host(sluice_client::Epoch),
    #[cfg(feature = "cuda")]
    Device(sluice_client::cuda::DeviceEpoch),
}

type Next = Option<Result<dlpack::Held, ClientError>>;

impl Batches {
    fn next_timeout(&mut self, timeout: Duration) -> Result<Next, ()> {
        match self {
            Batches::Host(e) => Ok(e.next_timeout(timeout)?.map(|b| b.map(dlpack::Held::Host))),
            #[cfg(feature = "cuda")]
            Batches::Device(e) => Ok(e
                .next_timeout(timeout)?
                .map(|b| b.map(dlpack::Held::Device))),
        }
    }

    fn host(&self) -> &sluice_client::Epoch {
        match self {
            Batches::Host(e) => e,
            #[cfg(feature = "cuda")]
            Batches::Device(e) => e.host(),
        }
    }
}

/// One epoch's batches: iterate for `(images, labels)`.
#[pyclass(module = "sluice")]
struct Epoch {
    inner: fork::ForkSafe<Mutex<Batches>>,
    requested: Arc<dlpack::Asked>,
    /// Fields asked for by name that no row of the first batches has had.
    absent: Arc<Absent>,
    /// The loader, kept alive while its epoch is read (its runtime drives the epoch).
    #[allow(dead_code)]
    loader: Option<Py<Loader>>,
}

/// Batches in which a field asked for by name must show up before it is warned about.
const FIELD_WARN_AFTER: u32 = 4;

/// A loader's watch for fields asked for by name that the data does not have (a misspelled
/// `"text"`, `"ALL"`, or the image's own `"jpg"`): warned about once per loader, after the
/// first batches of an epoch had none of them.
#[derive(Default)]
struct Absent {
    state: Mutex<(u32, Option<Vec<String>>)>,
    warned: std::sync::atomic::AtomicBool,
}

impl Absent {
    fn seen(&self, batch: &dlpack::Held, asked: &[String]) {
        use std::sync::atomic::Ordering::Relaxed;
        if asked.is_empty() || self.warned.load(Relaxed) {
            return;
        }
        let Some(host) = batch.host() else {
            return;
        };
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        let present = host.field_names();
        let (batches, missing) = &mut *s;
        let missing = missing.get_or_insert_with(|| asked.to_vec());
        missing.retain(|name| !present.contains(&name.as_str()));
        *batches += 1;
        if *batches >= FIELD_WARN_AFTER && !missing.is_empty() && !self.warned.swap(true, Relaxed) {
            log::warn!(
                "fields {missing:?} were asked for, but no sample of the first {batches} \
                 batches has them (their rows are None): is the name spelled as the shards' \
                 extension (\"txt\", \"json\", \"all\")? The image field is never sent"
            );
        }
    }
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(dlpack::Images, dlpack::Labels)>> {
        if let Some(pid) = self.inner.forked_from() {
            return Err(forked(pid));
        }
        loop {
            let next = py.allow_threads(|| {
                self.inner
                    .lock()
                    .map_err(|_| "the epoch's lock is poisoned".to_string())
                    .map(|mut e| e.next_timeout(Duration::from_millis(100)))
            });
            logs::deliver(py);
            match next.map_err(SluiceError::new_err)? {
                Err(()) => py.check_signals()?,
                Ok(None) => return Ok(None),
                Ok(Some(Err(e))) => return Err(client_error(e)),
                Ok(Some(Ok(batch))) => {
                    self.absent.seen(&batch, &self.requested.names);
                    logs::deliver(py);
                    return Ok(Some(dlpack::split(batch, self.requested.clone())));
                }
            }
        }
    }

    /// Batches this epoch yields: after a resume, the rest.
    fn __len__(&self) -> usize {
        self.inner
            .lock()
            .map(|e| e.host().batches_left() as usize)
            .unwrap_or(0)
    }

    /// What the epoch delivered so far.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self
            .inner
            .lock()
            .map_err(|_| SluiceError::new_err("the epoch's lock is poisoned"))?
            .host()
            .report();
        let d = PyDict::new(py);
        d.set_item("planned", r.planned)?;
        d.set_item("delivered", r.delivered)?;
        d.set_item("skipped", r.skipped)?;
        d.set_item("batches", r.batches)?;
        d.set_item("duplicates_dropped", r.duplicates_dropped)?;
        Ok(d)
    }
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Loader>()?;
    m.add_class::<Epoch>()?;
    m.add_class::<dlpack::Images>()?;
    m.add_class::<dlpack::Labels>()?;
    m.add("SluiceError", m.py().get_type::<SluiceError>())?;
    Ok(())
}
