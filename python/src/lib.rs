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
mod settings;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_client::ClientError;

pyo3::create_exception!(sluice, SluiceError, PyRuntimeError);

fn client_error(e: ClientError) -> PyErr {
    match e {
        ClientError::Config { .. } | ClientError::Checkpoint(_) => {
            PyValueError::new_err(e.to_string())
        }
        other => SluiceError::new_err(other.to_string()),
    }
}

/// Runs `f`, turning a Rust panic inside it into a `SluiceError` that names `what`: a bug
/// must not surface as pyo3's `PanicException`, a `BaseException` that `except Exception`
/// (and so every framework's error handling) lets through.
fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            Err(SluiceError::new_err(format!(
                "internal error in {what}: {why} (a bug in Sluice: please report it with \
                 this message)"
            )))
        }
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

/// Where batches go: host memory, or a GPU through the uploader.
enum Device {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(sluice_client::cuda::Uploader),
}

/// The GPU side of a loader: the page-locked ring's allocator and the uploader.
#[cfg(feature = "cuda")]
fn open_cuda(
    ordinal: usize,
    wanted: &sluice_client::LoaderConfig,
) -> PyResult<(Arc<dyn sluice_client::HostAllocator>, Device)> {
    use sluice_client::cuda::{Convert, Gpu, PinnedAllocator, Uploader};
    // Checked with the settings (`LoaderConfig::validate`).
    let mean = wanted.mean.unwrap_or(Convert::IMAGENET_MEAN);
    let std = wanted.std.unwrap_or(Convert::IMAGENET_STD);
    let dtype = wanted.dtype.as_str();
    let convert = Convert::to_dtype(dtype, mean, std).ok_or_else(|| {
        PyValueError::new_err(format!(
            "dtype {dtype:?}: expected \"uint8\", \"float32\" or \"float16\""
        ))
    })?;
    let failed =
        |e: &dyn std::fmt::Display| SluiceError::new_err(format!("device cuda:{ordinal}: {e}"));
    let gpu = Gpu::open(ordinal).map_err(|e| failed(&e))?;
    let uploader = Uploader::new(gpu.clone(), convert, 1).map_err(|e| failed(&e))?;
    Ok((Arc::new(PinnedAllocator::new(gpu)), Device::Cuda(uploader)))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    ordinal: usize,
    _: &sluice_client::LoaderConfig,
) -> PyResult<(Arc<dyn sluice_client::HostAllocator>, Device)> {
    Err(PyValueError::new_err(format!(
        "device \"cuda:{ordinal}\": this sluice was built without CUDA support; reinstall it with MATURIN_PEP517_ARGS=\"--features cuda\" pip install ./python, or take \"cpu\" batches and move them with .to(device)"
    )))
}

/// The engine in this process, with `threads` decode threads.
fn in_process_worker(py: Python<'_>, threads: usize) -> PyResult<Arc<sluice_cpu::CpuWorker>> {
    let engine = sluice_cpu::EngineConfig {
        threads,
        ..Default::default()
    };
    // The blocking HTTP client inside the source is made off any event loop.
    py.allow_threads(|| {
        let source = sluice_cpu::ShardSource::new(sluice_cpu::SourceConfig::default())
            .map_err(|e| e.to_string())?;
        sluice_cpu::CpuWorker::new(engine, source).map_err(|e| e.to_string())
    })
    .map(Arc::new)
    .map_err(SluiceError::new_err)
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

/// The Sluice loader (`sluice.Loader` wraps it). See the module documentation.
#[pyclass(module = "sluice._sluice", name = "_Loader")]
struct Loader {
    /// Torn down only in the process that made it (see [`fork`]).
    inner: fork::ForkSafe<sluice_client::Loader>,
    epoch: Mutex<u64>,
    device: fork::ForkSafe<Device>,
    /// The decoded size limit of a field's value.
    limits: Arc<dlpack::Limits>,
    absent: Arc<Absent>,
}

#[pymethods]
impl Loader {
    /// Made by `sluice.Loader` (python/sluice/_loader.py), which turns its keyword
    /// arguments into `config`, a `LoaderConfig` as JSON; beside it comes only a token given
    /// as text, which is a secret, not a setting (never in `config`, never printed).
    #[new]
    #[pyo3(signature = (dataset, config, *, token=None))]
    fn new(py: Python<'_>, dataset: &str, config: &str, token: Option<String>) -> PyResult<Self> {
        guard("sluice.Loader()", || Self::make(py, dataset, config, token))
    }

    /// A mixture's sources, in the order `images.source` numbers them (`[]` for a single
    /// dataset).
    #[getter]
    fn sources(&self) -> Vec<String> {
        self.inner.source_names().to_vec()
    }

    /// Samples every rank reads per epoch (after the last-batch policy).
    #[getter]
    fn samples_per_epoch(&self) -> u64 {
        self.inner.samples_per_epoch()
    }

    /// The loader's settings as validated (a `LoaderConfig` as JSON).
    #[getter]
    fn config(&self) -> String {
        serde_json::to_string(self.inner.config()).unwrap_or_default()
    }

    /// The batches of epoch `epoch` (resuming it when a checkpoint for it was loaded). The
    /// epoch keeps its loader alive: `for b in sluice.Loader(...).epoch(0)` reads it whole.
    fn epoch(slf: &Bound<'_, Self>, epoch: u64) -> PyResult<Epoch> {
        let mut read = guard("Loader.epoch()", || slf.borrow().read(slf.py(), epoch))?;
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
        let Some(c) = guard("Loader.state_dict()", || Ok(self.inner.state_dict()))? else {
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
        // `{}` is what state_dict() gives before the first batch: the plan from its start,
        // whatever was loaded or read since.
        let empty = |s: &Bound<'_, PyAny>| s.downcast::<PyDict>().is_ok_and(|d| d.is_empty());
        if states.iter().all(empty) {
            self.inner.restart();
            return Ok(());
        }
        let mut checkpoints = Vec::with_capacity(states.len());
        for s in &states {
            let text: String = json.call_method1("dumps", (s,))?.extract()?;
            checkpoints.push(
                sluice_client::Checkpoint::from_bytes(text.as_bytes()).map_err(client_error)?,
            );
        }
        let next = guard("Loader.load_state_dict()", || {
            self.inner
                .load_state_dicts(&checkpoints)
                .map_err(client_error)
        });
        // What the resume said (its rounding, the epoch it resumes at) reaches logging now.
        logs::deliver(py);
        self.set_epoch(next?);
        Ok(())
    }

    /// The epoch plain iteration reads next: `set_epoch`'s, or after `load_state_dict` the
    /// checkpoint's (the one after it for a state taken at an epoch's end).
    #[getter]
    fn next_epoch(&self) -> u64 {
        self.epoch.lock().map(|e| *e).unwrap_or(0)
    }

    /// Live figures: batches, samples, samples_per_s, starved_fraction, the shard bytes the
    /// workers read from storage and from their caches (and the hit ratio), workers (name,
    /// alive, samples, units in flight), and pool_changes (workers that joined or left the
    /// pool while epochs ran).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("batches", s.batches)?;
        d.set_item("samples", s.samples)?;
        d.set_item("samples_per_s", s.samples_per_s())?;
        d.set_item("starved_fraction", s.starved_fraction())?;
        d.set_item("storage_bytes", s.storage_bytes)?;
        d.set_item("cached_bytes", s.cached_bytes)?;
        d.set_item("cache_hit_ratio", s.cache_hit_ratio())?;
        let workers: Vec<(String, bool, u64, usize)> = s
            .workers
            .iter()
            .map(|w| (w.name.clone(), w.alive, w.samples, w.in_flight_units))
            .collect();
        d.set_item("workers", workers)?;
        d.set_item("pool_changes", s.pool_changes)?;
        Ok(d)
    }
}

impl Loader {
    /// [`Loader::new`]'s work, under its guard.
    fn make(py: Python<'_>, dataset: &str, config: &str, token: Option<String>) -> PyResult<Self> {
        logs::install();
        let mut config = settings::parse(config)?;
        // A mixture file gives the weights (and the epoch's length and schedule, unless
        // set): read first, so the settings are validated once, whole (a mistake is a
        // ValueError naming its key), before the GPU or any dataset is touched.
        let from_file =
            config.sources.is_empty() && sluice_dataset::mixture::is_mixture_file(dataset);
        let mixture = match from_file {
            true => {
                let m = py
                    .allow_threads(|| sluice_dataset::mixture::load(Path::new(dataset)))
                    .map_err(|e| PyValueError::new_err(format!("dataset: {e}")))?;
                let c = &mut config;
                Some(m.fill(&mut c.weights, &mut c.epoch_samples, &mut c.weight_schedule))
            }
            false => None,
        };
        let config = config.validated().map_err(client_error)?;
        // The GPU next: a machine without one fails before any worker is contacted.
        let (allocator, sink) = match config.device_ordinal() {
            None => (None, Device::Cpu),
            Some(n) => {
                let (a, d) = py.allow_threads(|| open_cuda(n, &config))?;
                (Some(a), d)
            }
        };
        let mut b = match mixture {
            Some(sources) => sluice_client::Loader::builder().sources(sources),
            None if !config.sources.is_empty() => {
                let mut loaded = Vec::with_capacity(config.sources.len());
                for name in &config.sources {
                    let m = py.allow_threads(|| load_dataset(name))?;
                    loaded.push((name.clone(), m));
                }
                sluice_client::Loader::builder().sources(loaded)
            }
            None => {
                let manifest = py.allow_threads(|| load_dataset(dataset))?;
                sluice_client::Loader::builder().dataset(manifest)
            }
        };
        if let Some(a) = allocator {
            b = b.allocator(a);
        }
        if let Some(t) = token {
            let t = sluice_wire::token::from_text(&t, "SLUICE_TOKEN")
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
            b = b.token(t);
        }
        if !config.remote() {
            b = b.in_process(in_process_worker(py, config.threads.unwrap_or(1))?);
        }
        let decoded = config.decoded_limit();
        let b = b.valid_config(config);
        let inner = py.allow_threads(|| b.build()).map_err(client_error);
        logs::deliver(py);
        Ok(Loader {
            inner: fork::ForkSafe::new(inner?),
            epoch: Mutex::new(0),
            device: fork::ForkSafe::new(sink),
            absent: Arc::default(),
            limits: Arc::new(dlpack::Limits {
                max_decoded_bytes: decoded,
            }),
        })
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
            limits: self.limits.clone(),
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
    limits: Arc<dlpack::Limits>,
    /// Fields asked for by name that no row of the first batches has had.
    absent: Arc<Absent>,
    /// The loader, kept alive while its epoch is read (its runtime drives the epoch).
    #[allow(dead_code)]
    loader: Option<Py<Loader>>,
}

/// Samples a field asked for by name must show up in before its absence is an error: the
/// first batch at the default batch size, and enough that a field most samples lack (one in
/// five, say) is not mistaken for a typo (0.8^64 < 1e-6).
const FIELD_CHECK_SAMPLES: u64 = 64;

/// Samples of a shorter epoch a field must be missing from for its absence to be an error at
/// the epoch's end, not a warning (0.8^32 < 0.1%).
const FIELD_CHECK_MIN_SAMPLES: u64 = 32;

/// A loader's check of the fields asked for by name: one that none of the first
/// [`FIELD_CHECK_SAMPLES`] samples has (a misspelled `"text"`, `"ALL"`, or the image's own
/// `"jpg"`), or none of a shorter epoch's, is an error naming the fields the samples do have,
/// not rows of `None`. Once per loader.
#[derive(Default)]
struct Absent {
    state: Mutex<AbsentState>,
}

#[derive(Default)]
struct AbsentState {
    samples: u64,
    /// The names asked for not seen yet (`None` before the first batch).
    missing: Option<Vec<String>>,
    /// Every field name the samples were seen to have, in first-seen order.
    has: Vec<String>,
    done: bool,
}

impl Absent {
    fn seen(&self, batch: &dlpack::Held) -> Result<(), String> {
        let Some(host) = batch.host() else {
            return Ok(());
        };
        let asked = host.requested_fields();
        let Ok(mut s) = self.state.lock() else {
            return Ok(());
        };
        if asked.is_empty() || s.done || host.is_empty() {
            return Ok(());
        }
        let present = host.present_fields();
        let missing = s.missing.get_or_insert_with(|| asked.to_vec());
        missing.retain(|name| !present.contains(&name.as_str()));
        s.samples += host.len() as u64;
        for name in host.names_samples_have() {
            if !s.has.iter().any(|h| h == name) {
                s.has.push(name.to_string());
            }
        }
        match s.samples >= FIELD_CHECK_SAMPLES {
            true => s.verdict(),
            false => Ok(()),
        }
    }

    /// At the end of an epoch shorter than the check: the same verdict on all of it, an
    /// error from [`FIELD_CHECK_MIN_SAMPLES`] samples on, a warning below (the tail of a
    /// resumed epoch may be a few samples that lack a field others have).
    fn ended(&self) -> Result<(), String> {
        let Ok(mut s) = self.state.lock() else {
            return Ok(());
        };
        if s.done || s.samples == 0 {
            return Ok(());
        }
        match (s.verdict(), s.samples >= FIELD_CHECK_MIN_SAMPLES) {
            (Err(why), false) => {
                log::warn!("{why}");
                Ok(())
            }
            (verdict, _) => verdict,
        }
    }
}

impl AbsentState {
    fn verdict(&mut self) -> Result<(), String> {
        self.done = true;
        let Some(first) = self.missing.as_ref().and_then(|m| m.first()) else {
            return Ok(());
        };
        let image = match self.has.iter().any(|n| n == first) {
            true => format!(" ({first:?} is the image: it is the tensor, never a field)"),
            false => String::new(),
        };
        Err(format!(
            "fields: {first:?} is in none of the first {} samples{image}; they have {}. A field \
             is named as its shard entry's extension (\"txt\", \"json\"); one that only a few \
             samples have comes with fields=\"all\"",
            self.samples,
            self.has
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

#[pymethods]
impl Epoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(
        &self,
        py: Python<'_>,
    ) -> PyResult<Option<(Py<dlpack::Images>, Py<dlpack::Labels>)>> {
        if let Some(pid) = self.inner.forked_from() {
            return Err(forked(pid));
        }
        loop {
            let next = guard("the epoch's next batch", || {
                Ok(py.allow_threads(|| {
                    self.inner
                        .lock()
                        .map_err(|_| "the epoch's lock is poisoned".to_string())
                        .map(|mut e| e.next_timeout(Duration::from_millis(100)))
                }))
            })?;
            logs::deliver(py);
            match next.map_err(SluiceError::new_err)? {
                Err(()) => py.check_signals()?,
                Ok(None) => {
                    let verdict = self.absent.ended();
                    logs::deliver(py);
                    if let Err(why) = verdict {
                        return Err(pyo3::exceptions::PyValueError::new_err(why));
                    }
                    return Ok(None);
                }
                Ok(Some(Err(e))) => return Err(client_error(e)),
                Ok(Some(Ok(batch))) => {
                    if let Err(why) = self.absent.seen(&batch) {
                        return Err(pyo3::exceptions::PyValueError::new_err(why));
                    }
                    logs::deliver(py);
                    let (images, labels) = dlpack::split(batch, self.limits.clone());
                    return Ok(Some((Py::new(py, images)?, Py::new(py, labels)?)));
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

    /// What the epoch delivered so far: counts (`reassigned`: units a lost worker held that
    /// went to another; `hedged`: units a slow worker held that another also ran), each
    /// source's delivered samples
    /// (`per_source`, one entry for a single dataset) and the shard bytes its units read from
    /// storage and from the workers' caches.
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let inner = self
            .inner
            .lock()
            .map_err(|_| SluiceError::new_err("the epoch's lock is poisoned"))?;
        let r = inner.host().report();
        let d = PyDict::new(py);
        d.set_item("planned", r.planned)?;
        d.set_item("delivered", r.delivered)?;
        d.set_item("skipped", r.skipped)?;
        d.set_item("batches", r.batches)?;
        d.set_item("duplicates_dropped", r.duplicates_dropped)?;
        d.set_item("reassigned", r.reassigned)?;
        d.set_item("hedged", r.hedged)?;
        d.set_item("per_source", inner.host().per_source().to_vec())?;
        d.set_item("storage_bytes", r.storage_bytes)?;
        d.set_item("cached_bytes", r.cached_bytes)?;
        Ok(d)
    }
}

/// Serves this process's client metrics (`sluice_client_*`: batches, samples, waits,
/// reassigned and hedged units, the pool) at `http://ADDR/metrics` for Prometheus, from a
/// thread of its own, for as long as the process runs; returns the bound `host:port` (port 0:
/// any free one). Call it once per process, before or after making loaders.
#[pyfunction]
#[pyo3(signature = (addr = "127.0.0.1:0"))]
fn serve_metrics(addr: &str) -> PyResult<String> {
    let parsed: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| PyValueError::new_err(format!("serve_metrics: {addr:?}: {e}")))?;
    let bound = sluice_daemon::serve_metrics_in_background(parsed)
        .map_err(|e| PyValueError::new_err(format!("serve_metrics: {addr}: {e}")))?;
    sluice_client::metrics::register();
    Ok(bound.to_string())
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve_metrics, m)?)?;
    m.add_class::<Loader>()?;
    m.add_class::<Epoch>()?;
    m.add_class::<dlpack::Tensor>()?;
    m.add_class::<dlpack::Images>()?;
    m.add_class::<dlpack::Labels>()?;
    m.add("SluiceError", m.py().get_type::<SluiceError>())?;
    Ok(())
}
