//! torch tensors as the API sees them, read through their Python attributes only (no libtorch
//! link): `dtype`, `device`, `is_contiguous()`, `numel()`, `data_ptr()`, `dim()`, `shape[0]`.
//! The Python tensor object itself is the owner the engine holds until the operation finished,
//! so a tensor the caller drops stays alive while an async operation still uses it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use torchcomms::{DataType, Device, Tensor};

use crate::error::{type_error, value_error};

struct Torch {
    tensor_type: Py<PyAny>,
    dtypes: Vec<(Py<PyAny>, DataType)>,
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
        Ok(Torch {
            tensor_type: torch.getattr("Tensor")?.unbind(),
            dtypes,
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

/// Converts one tensor argument `arg` of operation `op`.
pub(crate) fn to_tensor(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Tensor> {
    let py = obj.py();
    let t = torch(py)?;
    if !obj.is_instance(t.tensor_type.bind(py))? {
        return Err(type_error(format!(
            "{op}: argument `{arg}` must be a torch.Tensor, got {}",
            obj.get_type().name()?
        )));
    }
    let dtype_obj = obj.getattr("dtype")?;
    let dtype = t
        .dtypes
        .iter()
        .find(|(d, _)| d.bind(py).is(&dtype_obj))
        .map(|(_, dt)| *dt)
        .ok_or_else(|| {
            type_error(format!(
                "{op}: argument `{arg}` has dtype {}, which torchcomms does not support \
                 (supported: {SUPPORTED})",
                dtype_obj.str().map(|s| s.to_string()).unwrap_or_default()
            ))
        })?;
    let device_obj = obj.getattr("device")?;
    let device = match device_obj.getattr("type")?.extract::<String>()?.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => parse_device(&device_obj)?,
        other => {
            return Err(value_error(format!(
                "{op}: argument `{arg}` is on device {}, expected a cpu or cuda tensor",
                device_obj
                    .str()
                    .map(|s| s.to_string())
                    .unwrap_or(other.into())
            )))
        }
    };
    let contiguous: bool = obj.call_method0("is_contiguous")?.extract()?;
    let numel: usize = obj.call_method0("numel")?.extract()?;
    let ptr: usize = obj.call_method0("data_ptr")?.extract()?;
    let dim: usize = obj.call_method0("dim")?.extract()?;
    let rows = if dim == 0 {
        numel
    } else {
        obj.getattr("shape")?.get_item(0)?.extract::<usize>()?
    };
    let owner: Arc<Py<PyAny>> = Arc::new(obj.clone().unbind());
    // SAFETY: `ptr` is the tensor's `data_ptr()`, valid for `numel` elements of `dtype` while
    // the tensor object lives; the owner below keeps the object alive for as long as any
    // operation holds this descriptor. Concurrent writes by the caller while an async operation
    // runs are the caller's race, as in torch.distributed.
    let tensor = unsafe { Tensor::from_raw(ptr as *mut u8, numel, dtype, device) };
    Ok(tensor
        .with_owner(owner)
        .with_contiguous(contiguous)
        .with_rows(rows))
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
