//! torch tensors as the API sees them, without a libtorch link.
//!
//! Everything is read through torch's base class (`torch._C.TensorBase` methods and getters,
//! looked up once), never through attributes of the object: a `torch.Tensor` subclass may
//! override `numel()`, `data_ptr()`, `dtype`... and the engine reads and writes raw memory, so
//! believing it would crash every rank. For a subclass the reads also run with its
//! `__torch_function__` disabled, since that hook sees base-class calls too. Then the bytes
//! the operation will touch must lie inside the tensor's storage ([`crate::extent`]), which
//! also catches what `__torch_dispatch__` could still misreport.
//!
//! The tensor object and its storage object are the owner the engine holds until the
//! operation finished, so memory the caller drops (or re-points with `set_()`) stays alive
//! while an async operation still uses it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple, PyType};
use torchcomms::{DataType, Device, Tensor};

use crate::error::{type_error, value_error};
use crate::extent::{rows, Extent};

/// torch objects looked up once: the conversion runs on every operation's hot path.
struct Torch {
    tensor_type: Py<PyType>,
    parameter_type: Py<PyType>,
    disable_torch_function: Py<PyAny>,
    dtypes: Vec<(Py<PyAny>, DataType)>,
    // `torch._C.TensorBase` accessors.
    dtype: Py<PyAny>,
    device: Py<PyAny>,
    is_cpu: Py<PyAny>,
    is_cuda: Py<PyAny>,
    get_device: Py<PyAny>,
    is_contiguous: Py<PyAny>,
    numel: Py<PyAny>,
    data_ptr: Py<PyAny>,
    dim: Py<PyAny>,
    size: Py<PyAny>,
    untyped_storage: Py<PyAny>,
    // `torch._C.StorageBase` accessors.
    storage_ptr: Py<PyAny>,
    storage_nbytes: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

fn torch(py: Python<'_>) -> PyResult<&Torch> {
    TORCH.get_or_try_init(py, || {
        let torch = py.import("torch")?;
        let mut dtypes = Vec::new();
        for (name, dt) in [
            ("float16", DataType::F16),
            ("bfloat16", DataType::BF16),
            ("float32", DataType::F32),
            ("float64", DataType::F64),
            ("int8", DataType::I8),
            ("uint8", DataType::U8),
            ("int32", DataType::I32),
            ("int64", DataType::I64),
            ("bool", DataType::Bool),
        ] {
            dtypes.push((torch.getattr(name)?.unbind(), dt));
        }
        let c = torch.getattr("_C")?;
        let base = c.getattr("TensorBase")?;
        let storage = c.getattr("StorageBase")?;
        // Getters are descriptors: their bound `__get__` reads the base-class value.
        let getter = |name: &str| -> PyResult<Py<PyAny>> {
            Ok(base.getattr(name)?.getattr("__get__")?.unbind())
        };
        let method = |name: &str| -> PyResult<Py<PyAny>> { Ok(base.getattr(name)?.unbind()) };
        Ok(Torch {
            tensor_type: torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind(),
            parameter_type: torch
                .getattr("nn")?
                .getattr("Parameter")?
                .cast_into::<PyType>()?
                .unbind(),
            disable_torch_function: c.getattr("DisableTorchFunctionSubclass")?.unbind(),
            dtypes,
            dtype: getter("dtype")?,
            device: getter("device")?,
            is_cpu: getter("is_cpu")?,
            is_cuda: getter("is_cuda")?,
            get_device: method("get_device")?,
            is_contiguous: method("is_contiguous")?,
            numel: method("numel")?,
            data_ptr: method("data_ptr")?,
            dim: method("dim")?,
            size: method("size")?,
            untyped_storage: method("untyped_storage")?,
            storage_ptr: storage.getattr("data_ptr")?.unbind(),
            storage_nbytes: storage.getattr("nbytes")?.unbind(),
        })
    })
}

/// The dtypes this build handles, as torch names them (for error messages).
const SUPPORTED: &str = "torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, \
                         torch.uint8, torch.int32, torch.int64, torch.bool";

/// Parses a device given as `torch.device`, a string or an index (CUDA).
pub(crate) fn parse_device(dev: &Bound<'_, PyAny>) -> PyResult<Device> {
    let text = if let Ok(i) = dev.extract::<u32>() {
        format!("cuda:{i}")
    } else {
        dev.str()?.to_string()
    };
    text.parse::<Device>().map_err(|_| {
        value_error(format!(
            "device: expected cpu, cuda or cuda:N, got {text:?}"
        ))
    })
}

/// What keeps a tensor argument's memory alive while an operation uses it: the tensor object
/// and the storage object its extent was checked against.
#[derive(Debug)]
struct Owner {
    _tensor: Py<PyAny>,
    _storage: Py<PyAny>,
}

/// The base-class reads of one tensor, before they are checked.
struct Raw<'py> {
    dtype: DataType,
    device: Device,
    contiguous: bool,
    numel: u64,
    ptr: u64,
    dim: u64,
    dim0: u64,
    storage: Bound<'py, PyAny>,
    storage_ptr: u64,
    storage_bytes: u64,
}

/// Converts one tensor argument `arg` of operation `op`.
pub(crate) fn to_tensor(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Tensor> {
    let py = obj.py();
    let t = torch(py)?;
    let ty = obj.get_type();
    let exact = ty.is(t.tensor_type.bind(py)) || ty.is(t.parameter_type.bind(py));
    // The real type, not `isinstance`, which an object can fool with a `__class__` property.
    if !exact && !ty.is_subclass(t.tensor_type.bind(py))? {
        return Err(type_error(format!(
            "{op}: argument `{arg}` must be a torch.Tensor, got {}",
            ty.name()?
        )));
    }
    let raw = if exact {
        read(t, obj, op, arg)?
    } else {
        // A subclass's `__torch_function__` sees base-class calls too: switch it off.
        let guard = t.disable_torch_function.bind(py).call0()?;
        guard.call_method0("__enter__")?;
        let raw = read(t, obj, op, arg);
        let none = py.None();
        guard.call_method1("__exit__", (&none, &none, &none))?;
        raw?
    };
    let bad = |why: String| {
        value_error(format!(
            "{op}: invalid argument `{arg}`: {why} (a torch.Tensor subclass that misreports \
             its size, dtype, shape or data pointer?)"
        ))
    };
    let extent = Extent {
        ptr: raw.ptr,
        numel: raw.numel,
        elem_size: raw.dtype.size_bytes() as u64,
        storage_ptr: raw.storage_ptr,
        storage_bytes: raw.storage_bytes,
    };
    extent.check().map_err(|e| bad(e.to_string()))?;
    let rows = rows(raw.dim, raw.dim0, raw.numel).map_err(|e| bad(e.to_string()))?;
    // The extent fits in the address space (checked above), so these fit in usize.
    let (numel, rows) = (raw.numel as usize, rows as usize);
    let owner = Arc::new(Owner {
        _tensor: obj.clone().unbind(),
        _storage: raw.storage.unbind(),
    });
    // SAFETY: `[ptr, ptr + numel * dtype size)` lies inside the tensor's storage (checked
    // above against the storage's own address and size, read through torch's base classes),
    // and the owner keeps that storage object, hence its memory, alive for as long as any
    // operation holds this descriptor. Concurrent writes by the caller while an async
    // operation runs are the caller's race, as in torch.distributed.
    let tensor =
        unsafe { Tensor::from_raw(raw.ptr as usize as *mut u8, numel, raw.dtype, raw.device) };
    Ok(tensor
        .with_owner(owner)
        .with_contiguous(raw.contiguous)
        .with_rows(rows))
}

/// Reads a tensor's metadata through the base class. A failure (a subclass without storage,
/// a meta tensor) is a bad argument naming `arg`.
fn read<'py>(t: &Torch, obj: &Bound<'py, PyAny>, op: &str, arg: &str) -> PyResult<Raw<'py>> {
    let py = obj.py();
    let unreadable = |what: &str, e: PyErr| {
        value_error(format!(
            "{op}: invalid argument `{arg}`: cannot read its {what}: {e}"
        ))
    };
    let dtype_obj = t
        .dtype
        .call1(py, (obj,))
        .map_err(|e| unreadable("dtype", e))?;
    let dtype_obj = dtype_obj.bind(py);
    let dtype = t
        .dtypes
        .iter()
        .find(|(d, _)| d.bind(py).is(dtype_obj))
        .map(|(_, dt)| *dt)
        .ok_or_else(|| {
            type_error(format!(
                "{op}: argument `{arg}` has dtype {}, which torchcomms does not support \
                 (supported: {SUPPORTED})",
                dtype_obj.str().map(|s| s.to_string()).unwrap_or_default()
            ))
        })?;
    let flag = |f: &Py<PyAny>| f.call1(py, (obj,)).and_then(|v| v.extract::<bool>(py));
    // Two flags and an index cost a fraction of reading and naming a `torch.device`; the
    // device object is read only to name one that is neither CPU nor CUDA.
    let device = if flag(&t.is_cpu).map_err(|e| unreadable("device", e))? {
        Device::Cpu
    } else if flag(&t.is_cuda).map_err(|e| unreadable("device", e))? {
        let index = t
            .get_device
            .call1(py, (obj,))
            .and_then(|v| v.extract::<u32>(py))
            .map_err(|e| unreadable("device", e))?;
        Device::Cuda(index)
    } else {
        let device_obj = t
            .device
            .call1(py, (obj,))
            .map_err(|e| unreadable("device", e))?;
        return Err(value_error(format!(
            "{op}: argument `{arg}` is on device {}, expected a cpu or cuda tensor",
            device_obj.bind(py).str()?
        )));
    };
    let int = |f: &Py<PyAny>, what: &str| -> PyResult<u64> {
        f.call1(py, (obj,))
            .and_then(|v| v.extract::<u64>(py))
            .map_err(|e| unreadable(what, e))
    };
    let contiguous = flag(&t.is_contiguous).map_err(|e| unreadable("layout", e))?;
    let numel = int(&t.numel, "size")?;
    let dim = int(&t.dim, "shape")?;
    // A tensor of at most one dimension has as many rows as elements.
    let dim0 = if dim <= 1 {
        numel
    } else {
        t.size
            .call1(py, (obj, 0))
            .and_then(|v| v.extract::<u64>(py))
            .map_err(|e| unreadable("shape", e))?
    };
    let ptr = int(&t.data_ptr, "data pointer")?;
    let storage = t
        .untyped_storage
        .bind(py)
        .call1((obj,))
        .map_err(|e| unreadable("storage", e))?;
    let storage_int = |f: &Py<PyAny>| -> PyResult<u64> {
        f.call1(py, (&storage,))
            .and_then(|v| v.extract::<u64>(py))
            .map_err(|e| unreadable("storage", e))
    };
    let storage_ptr = storage_int(&t.storage_ptr)?;
    let storage_bytes = storage_int(&t.storage_nbytes)?;
    Ok(Raw {
        dtype,
        device,
        contiguous,
        numel,
        ptr,
        dim,
        dim0,
        storage,
        storage_ptr,
        storage_bytes,
    })
}

/// Items of a list or tuple argument (anything else is a type error naming the argument).
pub(crate) fn seq_items<'py>(
    obj: &Bound<'py, PyAny>,
    op: &str,
    arg: &str,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(l.iter().collect());
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(t.iter().collect());
    }
    Err(type_error(format!(
        "{op}: argument `{arg}` must be a list of torch.Tensor, got {}",
        obj.get_type().name()?
    )))
}

/// Converts a list argument of tensors.
pub(crate) fn to_tensors(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Vec<Tensor>> {
    seq_items(obj, op, arg)?
        .iter()
        .enumerate()
        .map(|(i, t)| to_tensor(t, op, &format!("{arg}[{i}]")))
        .collect()
}
