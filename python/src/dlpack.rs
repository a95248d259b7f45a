//! Batches as DLPack tensors: the capsule points into the loader's ring buffer (or, for
//! `device="cuda:N"`, into the uploader's device buffer), and its deleter drops a reference to
//! the batch, so the buffer is reused only when the last consumer (a torch tensor, a numpy
//! array, the Python object) lets go.
//!
//! Device batches follow the DLPack stream rule: `__dlpack__(stream=s)` makes the consumer's
//! stream `s` wait for the copy (without blocking the host), and the device buffer is refilled
//! only after the work queued on `s` before the last reference went away.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

const KDL_CPU: i32 = 1;
const KDL_CUDA: i32 = 2;
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const NAME: &std::ffi::CStr = c"dltensor";

/// A batch as the loader handed it out.
pub enum Held {
    Host(sluice_client::Batch),
    #[cfg(feature = "cuda")]
    Device(sluice_client::cuda::DeviceBatch),
}

/// The batch, shared by its Python objects and every DLPack export (read only to order a
/// consumer's stream after a device batch's copy). A batch let go in a forked child does not
/// go back to the ring: the ring's threads are the parent's.
struct Owner(crate::fork::ForkSafe<Mutex<Held>>);

/// What a capsule keeps alive.
struct Context {
    shape: Vec<i64>,
    _owner: Arc<Owner>,
}

unsafe extern "C" fn delete_managed(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` and its context were made by `export` with Box::into_raw, and DLPack calls
    // the deleter once.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx as *mut Context));
    }
}

/// A capsule never consumed still owns its tensor; a consumed one was renamed
/// "used_dltensor" and belongs to its consumer.
unsafe extern "C" fn delete_capsule(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let m = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()) as *mut DLManagedTensor;
            delete_managed(m);
        } else {
            ffi::PyErr_Clear();
        }
    }
}

fn export(
    py: Python<'_>,
    data: usize,
    shape: Vec<i64>,
    dtype: DLDataType,
    owner: &Arc<Owner>,
    (device_type, device_id): (i32, i32),
) -> PyResult<PyObject> {
    let ctx = Box::new(Context {
        shape,
        _owner: owner.clone(),
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: data as *mut c_void,
            device: DLDevice {
                device_type,
                device_id,
            },
            ndim: ctx.shape.len() as i32,
            dtype,
            shape: ctx.shape.as_ptr() as *mut i64,
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: Box::into_raw(ctx) as *mut c_void,
        deleter: Some(delete_managed),
    });
    let raw = Box::into_raw(managed);
    // SAFETY: `raw` is a valid DLManagedTensor; the capsule's destructor frees it unless a
    // consumer took it over.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw as *mut c_void, NAME.as_ptr(), Some(delete_capsule));
        if capsule.is_null() {
            delete_managed(raw);
            return Err(PyErr::fetch(py));
        }
        Ok(PyObject::from_owned_ptr(py, capsule))
    }
}

/// `__dlpack__` for either half: checks the consumer's arguments, orders its stream after the
/// copy (device batches), then exports.
fn dlpack(
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
    dl_device: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
    (data, shape, dtype): (usize, Vec<i64>, DLDataType),
    owner: &Arc<Owner>,
    device: (i32, i32),
) -> PyResult<PyObject> {
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "sluice batches are exported without copying",
        ));
    }
    if let Some(d) = dl_device.filter(|d| !d.is_none()) {
        let wanted: (i32, i32) = d.extract()?;
        if wanted != device {
            return Err(PyBufferError::new_err(format!(
                "dl_device {wanted:?} asked for a batch on {device:?}: sluice does not copy between devices"
            )));
        }
    }
    match device.0 {
        KDL_CUDA => wait_on(stream, owner)?,
        _ => check_cpu_stream(stream)?,
    }
    export(py, data, shape, dtype, owner, device)
}

fn check_cpu_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    match stream {
        None => Ok(()),
        Some(s) if s.is_none() => Ok(()),
        // -1: "no synchronization" in the DLPack protocol.
        Some(s) if s.extract::<i64>().ok() == Some(-1) => Ok(()),
        Some(s) => Err(PyBufferError::new_err(format!(
            "stream {s} given for a CPU batch: CPU tensors take stream=None"
        ))),
    }
}

/// The DLPack stream argument for CUDA: None is the legacy default stream, 1 the legacy
/// default stream, 2 the per-thread default stream, any other positive value a `cudaStream_t`,
/// -1 "do not synchronize"; 0 is ambiguous and refused.
fn cuda_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let value = match stream {
        None => return Ok(Some(1)),
        Some(s) if s.is_none() => return Ok(Some(1)),
        Some(s) => s.extract::<i64>().map_err(|_| {
            PyBufferError::new_err(format!("stream {s}: expected an integer or None"))
        })?,
    };
    match value {
        -1 => Ok(None),
        0 => Err(PyBufferError::new_err(
            "stream 0 is ambiguous for CUDA: pass 1 (legacy default stream), 2 (per-thread default stream) or a stream handle",
        )),
        v if v > 0 => Ok(Some(v as usize)),
        v => Err(PyBufferError::new_err(format!("stream {v}: not a CUDA stream"))),
    }
}

#[cfg(feature = "cuda")]
fn wait_on(stream: Option<&Bound<'_, PyAny>>, owner: &Arc<Owner>) -> PyResult<()> {
    let Some(stream) = cuda_stream(stream)? else {
        return Ok(());
    };
    let held = owner
        .0
        .lock()
        .map_err(|_| PyBufferError::new_err("the batch's lock is poisoned"))?;
    match &*held {
        // SAFETY: the DLPack contract: the consumer passes a live stream of the batch's
        // device (or a special handle) and keeps it while it uses the data, which is at least
        // as long as the batch lives. Waiting on an event does not block the host.
        Held::Device(d) => {
            unsafe { d.wait_on(stream as sluice_client::cuda::cudarc::driver::sys::CUstream) }
                .map_err(|e| PyBufferError::new_err(e.to_string()))
        }
        Held::Host(_) => Ok(()),
    }
}

#[cfg(not(feature = "cuda"))]
fn wait_on(stream: Option<&Bound<'_, PyAny>>, _owner: &Arc<Owner>) -> PyResult<()> {
    cuda_stream(stream).map(|_| ())
}

/// One half of a batch exported through DLPack: its images or its labels, sharing the
/// batch (`owner`), in host memory or on the batch's GPU.
#[pyclass(module = "sluice", frozen, subclass)]
pub struct Tensor {
    owner: Arc<Owner>,
    data: usize,
    shape: Vec<i64>,
    dtype: (u8, u8),
    device: (i32, i32),
}

/// The images of a batch: N×H×W×C (or N×C×H×W) in the pipeline's dtype, in host memory or,
/// with `device="cuda:N"`, on that GPU.
#[pyclass(module = "sluice", frozen, extends = Tensor)]
pub struct Images {
    /// The batch's metadata (the same batch as the tensor's).
    owner: Arc<Owner>,
    ids: Vec<(u32, u64)>,
    keys: Vec<String>,
    sources: Vec<u32>,
    padding: Vec<bool>,
    skipped: Vec<((u32, u64), String)>,
    index: u64,
    /// How large a decoded field value may be.
    limits: Arc<Limits>,
}

/// The labels of a batch: an int64 vector read from the loader's `label` field (`cls` by
/// default; every label -1 with `label=None`), beside the images (host memory or the same
/// GPU). A sample whose label is missing or not an integer is skipped, never given -1.
#[pyclass(module = "sluice", frozen, extends = Tensor)]
pub struct Labels {
    len: usize,
}

/// Where a batch's images and labels are, and how they are laid out.
struct View {
    images: usize,
    labels: usize,
    dims: Vec<usize>,
    dtype: (u8, u8),
    device: (i32, i32),
}

fn host_dtype(elem_bytes: u32) -> (u8, u8) {
    let code = if elem_bytes == 1 { KDL_UINT } else { KDL_FLOAT };
    (code, (elem_bytes * 8) as u8)
}

impl Held {
    pub fn host(&self) -> Option<&sluice_client::Batch> {
        match self {
            Held::Host(b) => Some(b),
            #[cfg(feature = "cuda")]
            Held::Device(d) => d.host(),
        }
    }

    fn view(&self) -> View {
        match self {
            Held::Host(b) => View {
                images: b.as_ptr() as usize,
                labels: b.labels().as_ptr() as usize,
                dims: b.dims(),
                dtype: host_dtype(b.shape().elem_bytes),
                device: (KDL_CPU, 0),
            },
            #[cfg(feature = "cuda")]
            Held::Device(d) => {
                use sluice_client::cuda::DType;
                let dtype = match d.dtype() {
                    DType::U8 => (KDL_UINT, 8),
                    DType::F16 => (KDL_FLOAT, 16),
                    DType::F32 => (KDL_FLOAT, 32),
                };
                View {
                    images: d.images_ptr() as usize,
                    labels: d.labels_ptr() as usize,
                    dims: d.dims().to_vec(),
                    dtype,
                    device: (KDL_CUDA, d.device() as i32),
                }
            }
        }
    }
}

/// A loader's limits on decoding each batch's fields.
pub struct Limits {
    /// The most bytes a field's value may decode to (`npy`, `npz`).
    pub max_decoded_bytes: u64,
}

/// A batch's two DLPack-exporting halves, which share it.
pub type Halves = (PyClassInitializer<Images>, PyClassInitializer<Labels>);

/// Splits a batch into its two DLPack-exporting halves, which share it.
pub fn split(held: Held, limits: Arc<Limits>) -> Halves {
    let view = held.view();
    let host = held.host();
    let rows = view.dims[0];
    let images = Images {
        ids: host.map_or_else(Vec::new, |b| {
            b.ids().iter().map(|i| (i.shard, i.index)).collect()
        }),
        keys: host.map_or_else(Vec::new, |b| b.keys().to_vec()),
        sources: host.map_or_else(Vec::new, |b| b.sources().to_vec()),
        padding: host.map_or_else(Vec::new, |b| b.padding().to_vec()),
        skipped: host.map_or_else(Vec::new, |b| {
            b.skipped()
                .iter()
                .map(|(i, why)| ((i.shard, i.index), why.clone()))
                .collect()
        }),
        index: host.map_or(0, |b| b.index()),
        limits,
        owner: Arc::new(Owner(crate::fork::ForkSafe::new(Mutex::new(held)))),
    };
    let tensor = |data, shape, dtype| Tensor {
        owner: images.owner.clone(),
        data,
        shape,
        dtype,
        device: view.device,
    };
    let dims = view.dims.iter().map(|d| *d as i64).collect();
    let labels = tensor(view.labels, vec![rows as i64], (KDL_INT, 64));
    let images =
        PyClassInitializer::from(tensor(view.images, dims, view.dtype)).add_subclass(images);
    (
        images,
        PyClassInitializer::from(labels).add_subclass(Labels { len: rows }),
    )
}

#[pymethods]
impl Tensor {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        let _ = max_version;
        let dtype = DLDataType {
            code: self.dtype.0,
            bits: self.dtype.1,
            lanes: 1,
        };
        dlpack(
            py,
            stream,
            dl_device,
            copy,
            (self.data, self.shape.clone(), dtype),
            &self.owner,
            self.device,
        )
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.device
    }

    /// The address of the first element, host or device (to check that consumers did not
    /// copy).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.data
    }

    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// The element type's name, as numpy and torch spell it.
    #[getter]
    fn dtype(&self) -> &'static str {
        match self.dtype {
            (KDL_UINT, 8) => "uint8",
            (KDL_FLOAT, 16) => "float16",
            (KDL_FLOAT, 32) => "float32",
            (KDL_INT, 64) => "int64",
            _ => "unknown",
        }
    }

    /// "cpu" or "cuda:N".
    #[getter]
    fn device(&self) -> String {
        match self.device {
            (KDL_CUDA, n) => format!("cuda:{n}"),
            _ => "cpu".into(),
        }
    }
}

#[pymethods]
impl Images {
    /// (shard index, sample index) of each row.
    #[getter]
    fn ids(&self) -> Vec<(u32, u64)> {
        self.ids.clone()
    }

    #[getter]
    fn keys(&self) -> Vec<String> {
        self.keys.clone()
    }

    /// Each sample's source: its place in the loader's `sources` (0 for a single dataset).
    #[getter]
    fn source(&self) -> Vec<u32> {
        self.sources.clone()
    }

    /// True for rows that repeat another sample to fill a batch that lost samples.
    #[getter]
    fn padding(&self) -> Vec<bool> {
        self.padding.clone()
    }

    /// ((shard, index), reason) of samples of this batch the decoder rejected.
    #[getter]
    fn skipped(&self) -> Vec<((u32, u64), String)> {
        self.skipped.clone()
    }

    /// The batch's position in its epoch.
    #[getter]
    fn index(&self) -> u64 {
        self.index
    }

    fn __len__(&self) -> usize {
        self.ids.len()
    }

    /// The fields the loader asked for by name, then any other a row has (`fields="all"`),
    /// in first-seen order.
    #[getter]
    fn field_names(&self) -> Vec<String> {
        self.with_batch(|b| b.field_names().into_iter().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Field `name` of each row as raw bytes, `None` where the sample lacks it.
    fn field_bytes<'py>(&self, py: Python<'py>, name: &str) -> Vec<Option<Bound<'py, PyBytes>>> {
        self.with_batch(|b| {
            (0..b.len())
                .map(|i| b.field(i, name).map(|v| PyBytes::new(py, v)))
                .collect()
        })
        .unwrap_or_default()
    }

    /// The most bytes a field's value may decode to (`max_decoded_bytes`): an `npy` or `npz`
    /// that would expand past it is refused by name, never allocated.
    #[getter]
    fn max_decoded_bytes(&self) -> u64 {
        self.limits.max_decoded_bytes
    }

    /// `{field: [value of each row]}`, each field decoded by its extension the first time it
    /// is read (`txt` → str, `json` → object, `cls` → int, `npy` → ndarray, else bytes;
    /// `None` where a sample lacks the field). See `sluice.Fields`.
    #[getter]
    fn fields<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("sluice._fields")?
            .getattr("Fields")?
            .call1((slf.clone(),))
    }

    /// Per row: `{"source": (h, w), "box": (x0, y0, x1, y1), "size": (h, w), "flip": bool}`,
    /// the crop box in source pixels (after EXIF orientation) that was resampled to `size`
    /// and then mirrored if `flip`; a clip's row adds `"frames"`, its source frames, and a row
    /// whose pixel ops moved pixels (rotate, shear, translate, or an augment that drew one)
    /// adds `"affine"`: `[a, b, c, d, e, f]`, taking (x, y) of the cropped and flipped image
    /// to (a·x + b·y + c, d·x + e·y + f). `sluice.transform_boxes` maps annotations with it.
    #[getter]
    fn geometry<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let rows: Vec<sluice_client::SampleGeometry> = self
            .with_batch(|b| b.geometry().to_vec())
            .unwrap_or_default();
        rows.iter()
            .map(|g| {
                let d = PyDict::new(py);
                d.set_item("source", g.source)?;
                d.set_item("box", g.crop)?;
                d.set_item("size", g.size)?;
                d.set_item("flip", g.flip)?;
                if let Some(f) = &g.frames {
                    d.set_item("frames", f.indices().collect::<Vec<u32>>())?;
                }
                if let Some(m) = &g.affine {
                    d.set_item("affine", m.to_vec())?;
                }
                Ok(d)
            })
            .collect()
    }

    /// A batch of clips: per row, the source frame of each of its T frames (the crop box in
    /// `geometry` is every frame's); `None` for a batch of images.
    #[getter]
    fn frames(&self) -> Option<Vec<Vec<u32>>> {
        let rows: Vec<sluice_client::SampleGeometry> =
            self.with_batch(|b| b.geometry().to_vec())?;
        rows.iter()
            .map(|g| g.frames.map(|f| f.indices().collect()))
            .collect()
    }
}

impl Images {
    /// Runs `f` on the host side of the batch (its metadata; a device batch keeps it too).
    fn with_batch<T>(&self, f: impl FnOnce(&sluice_client::Batch) -> T) -> Option<T> {
        let held = self.owner.0.lock().ok()?;
        held.host().map(f)
    }
}

#[pymethods]
impl Labels {
    fn __len__(&self) -> usize {
        self.len
    }
}
