//! Batches as DLPack tensors: the capsule points into the loader's ring buffer, and its
//! deleter drops a reference to the batch, so the buffer goes back to the ring only when the
//! last consumer (a torch tensor, a numpy array, the Python object) lets go.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

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
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const NAME: &std::ffi::CStr = c"dltensor";

/// The batch, shared by its Python objects and every DLPack export.
struct Owner(#[allow(dead_code)] Mutex<sluice_client::Batch>);

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
) -> PyResult<PyObject> {
    let ctx = Box::new(Context {
        shape,
        _owner: owner.clone(),
    });
    let managed = Box::new(DLManagedTensor {
        dl_tensor: DLTensor {
            data: data as *mut c_void,
            device: DLDevice {
                device_type: KDL_CPU,
                device_id: 0,
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

/// `__dlpack__` for either half: checks the consumer's arguments, then exports.
fn dlpack(
    py: Python<'_>,
    stream: Option<&Bound<'_, PyAny>>,
    copy: Option<bool>,
    (data, shape, dtype): (usize, Vec<i64>, DLDataType),
    owner: &Arc<Owner>,
) -> PyResult<PyObject> {
    check_stream(stream)?;
    if copy == Some(true) {
        return Err(PyBufferError::new_err(
            "sluice batches are exported without copying",
        ));
    }
    export(py, data, shape, dtype, owner)
}

fn check_stream(stream: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
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

/// The images of a batch: N×H×W×C (or N×C×H×W) in the pipeline's dtype.
#[pyclass(module = "sluice", frozen)]
pub struct Images {
    owner: Arc<Owner>,
    data: usize,
    shape: Vec<i64>,
    elem_bytes: u32,
    ids: Vec<(u32, u64)>,
    keys: Vec<String>,
    padding: Vec<bool>,
    skipped: Vec<((u32, u64), String)>,
    index: u64,
}

/// The labels of a batch: an int64 vector (-1 for a sample without a `.cls` field).
#[pyclass(module = "sluice", frozen)]
pub struct Labels {
    owner: Arc<Owner>,
    data: usize,
    len: i64,
}

/// Splits a batch into its two DLPack-exporting halves, which share it.
pub fn split(batch: sluice_client::Batch) -> (Images, Labels) {
    let dims = batch.dims();
    let shape = batch.shape();
    let images = Images {
        data: batch.as_ptr() as usize,
        shape: dims.iter().map(|d| *d as i64).collect(),
        elem_bytes: shape.elem_bytes,
        ids: batch.ids().iter().map(|i| (i.shard, i.index)).collect(),
        keys: batch.keys().to_vec(),
        padding: batch.padding().to_vec(),
        skipped: batch
            .skipped()
            .iter()
            .map(|(i, why)| ((i.shard, i.index), why.clone()))
            .collect(),
        index: batch.index(),
        owner: Arc::new(Owner(Mutex::new(batch))),
    };
    let labels = {
        let b = images.owner.0.lock().ok();
        let (data, len) = b.map_or((0, 0), |b| {
            (b.labels().as_ptr() as usize, b.labels().len() as i64)
        });
        Labels {
            owner: images.owner.clone(),
            data,
            len,
        }
    };
    (images, labels)
}

#[pymethods]
impl Images {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        let _ = (max_version, dl_device);
        let code = if self.elem_bytes == 1 {
            KDL_UINT
        } else {
            KDL_FLOAT
        };
        let dtype = DLDataType {
            code,
            bits: (self.elem_bytes * 8) as u8,
            lanes: 1,
        };
        dlpack(
            py,
            stream,
            copy,
            (self.data, self.shape.clone(), dtype),
            &self.owner,
        )
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }

    /// The address of the first element (to check that consumers did not copy).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.data
    }

    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// (shard index, sample index) of each row.
    #[getter]
    fn ids(&self) -> Vec<(u32, u64)> {
        self.ids.clone()
    }

    #[getter]
    fn keys(&self) -> Vec<String> {
        self.keys.clone()
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
}

#[pymethods]
impl Labels {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<PyObject> {
        let _ = (max_version, dl_device);
        let dtype = DLDataType {
            code: KDL_INT,
            bits: 64,
            lanes: 1,
        };
        dlpack(
            py,
            stream,
            copy,
            (self.data, vec![self.len], dtype),
            &self.owner,
        )
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CPU, 0)
    }

    #[getter]
    fn data_ptr(&self) -> usize {
        self.data
    }

    fn __len__(&self) -> usize {
        self.len as usize
    }
}
