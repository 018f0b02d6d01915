//! Creating communicators: `new_comm` (backend discovery, options, the store), and backends
//! written in Python (upstream §13: `TorchCommBackend`, `register_backend`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::args::{callable_arg, hints_arg, opt_bool_arg, str_arg};
use crate::comm::{no_allocator, PyTorchComm};
use crate::core::{Backend, CommCore, NativeComm};
use crate::error::{guard, value_error, ResultExt};
use crate::store::PyStore;
use crate::tensor::parse_device;
use crate::types::{timeout_arg, PyCommOptions};

fn py_backends() -> &'static Mutex<BTreeMap<String, Py<PyAny>>> {
    static R: std::sync::OnceLock<Mutex<BTreeMap<String, Py<PyAny>>>> = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
}

/// Base class of backends written in Python. Subclass it, override `init(device, name,
/// options)`, `finalize()`, `get_rank()`, `get_size()`, `get_backend_name()`,
/// `get_comm_name()`, `split(ranks, name, options)` and the collectives (called without hints
/// or timeout, e.g. `all_reduce(tensor, op, async_op)`; return None or an object with
/// `wait()`), then `register_backend(name, cls)`.
#[pyclass(module = "torchcomms._comms", name = "TorchCommBackend", subclass)]
#[derive(Debug, Default)]
pub(crate) struct PyTorchCommBackend {}

#[pymethods]
impl PyTorchCommBackend {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        PyTorchCommBackend {}
    }
}

/// Registers `backend_class` (a `TorchCommBackend` subclass) under `name`; `new_comm(name,
/// ...)` creates a new instance per communicator.
#[pyfunction]
pub(crate) fn register_backend(
    name: &Bound<'_, PyAny>,
    backend_class: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let op = "register_backend";
    let name = str_arg(name, op, "name")?;
    let backend_class = callable_arg(backend_class, op, "backend_class")?;
    py_backends()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(name, backend_class);
    Ok(())
}

fn py_backend(py: Python<'_>, name: &str) -> Option<Py<PyAny>> {
    py_backends()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(name)
        .map(|c| c.clone_ref(py))
}

/// Whether a backend of this name is registered (Rust backends linked in, or Python ones).
#[pyfunction]
pub(crate) fn _is_backend_registered(py: Python<'_>, name: &str) -> bool {
    py_backend(py, name).is_some() || torchcomms::is_backend_registered(name)
}

/// Names of the backends registered in this process.
#[pyfunction]
pub(crate) fn _registered_backends() -> Vec<String> {
    let mut v = torchcomms::backend_names();
    v.extend(
        py_backends()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned(),
    );
    v.sort();
    v.dedup();
    v
}

/// The global allocator of `backend`: none is registered in this build.
#[pyfunction]
pub(crate) fn get_mem_allocator(backend: &Bound<'_, PyAny>) -> PyResult<()> {
    Err(no_allocator(&str_arg(
        backend,
        "get_mem_allocator",
        "backend",
    )?))
}

pub(crate) fn python_comm(
    py: Python<'_>,
    instance: &Bound<'_, PyAny>,
    backend_name: &str,
    device: &Bound<'_, PyAny>,
    options: PyCommOptions,
) -> PyResult<Py<PyTorchComm>> {
    let rank: usize = instance.call_method0("get_rank")?.extract()?;
    let size: usize = instance.call_method0("get_size")?.extract()?;
    let name: String = instance.call_method0("get_comm_name")?.extract()?;
    let core = CommCore::new(
        Backend::Python(instance.clone().unbind()),
        backend_name,
        &name,
        (rank, size),
        device.clone().unbind(),
        options,
    );
    Py::new(py, PyTorchComm::new(core, None))
}

/// The error for a backend whose entry point loaded but registered nothing. Upstream then
/// loads `TORCHCOMMS_BACKEND_LIB_PATH_<BACKEND>` and calls its `create_dynamic_loader_<backend>`,
/// which hands back C++ backend objects (loader ABI 1.3); torchcomms-rs cannot drive those, so
/// it says so, naming the library, and keeps upstream's message when the variable is unset.
fn no_factory(backend: &str) -> PyErr {
    let key = format!("TORCHCOMMS_BACKEND_LIB_PATH_{}", backend.to_uppercase());
    match std::env::var_os(&key) {
        None => PyRuntimeError::new_err(format!("Backend {backend} specified, but {key} not set")),
        Some(path) => pyo3::exceptions::PyNotImplementedError::new_err(format!(
            "{key}={}: loading a C++ backend library (create_dynamic_loader_{backend}, loader \
             ABI 1.3) is not supported by torchcomms-rs; provide the backend through a \
             `torchcomms.backends` entry point that registers it, or \
             torchcomms.register_backend()",
            path.to_string_lossy()
        )),
    }
}

/// Creates a communicator over all ranks (a collective). Rank and size come from the
/// launcher's environment (torchrun, SLURM, MPI); the store from `store=` or
/// `MASTER_ADDR`/`MASTER_PORT`.
#[pyfunction]
#[pyo3(signature = (backend, device, name, abort_process_on_timeout_or_error=None, timeout=None, is_high_priority_stream=None, store=None, enable_reconfigure=None, hints=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_comm(
    py: Python<'_>,
    backend: &Bound<'_, PyAny>,
    device: &Bound<'_, PyAny>,
    name: &Bound<'_, PyAny>,
    abort_process_on_timeout_or_error: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    is_high_priority_stream: Option<&Bound<'_, PyAny>>,
    store: Option<&Bound<'_, PyAny>>,
    enable_reconfigure: Option<&Bound<'_, PyAny>>,
    hints: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyTorchComm>> {
    let op = "new_comm";
    let backend = &str_arg(backend, op, "backend")?;
    let name = &str_arg(name, op, "name")?;
    let abort_process_on_timeout_or_error = opt_bool_arg(
        abort_process_on_timeout_or_error,
        op,
        "abort_process_on_timeout_or_error",
    )?;
    let is_high_priority_stream =
        opt_bool_arg(is_high_priority_stream, op, "is_high_priority_stream")?;
    let enable_reconfigure =
        opt_bool_arg(enable_reconfigure, op, "enable_reconfigure")?.unwrap_or(false);
    let hints = hints_arg(hints, op)?;
    guard(op, || {
        new_comm_inner(
            py,
            backend,
            device,
            name,
            abort_process_on_timeout_or_error,
            timeout,
            is_high_priority_stream,
            store,
            enable_reconfigure,
            hints,
        )
    })
}

#[allow(clippy::too_many_arguments)]
fn new_comm_inner(
    py: Python<'_>,
    backend: &str,
    device: &Bound<'_, PyAny>,
    name: &str,
    abort_process_on_timeout_or_error: Option<bool>,
    timeout: Option<&Bound<'_, PyAny>>,
    is_high_priority_stream: Option<bool>,
    store: Option<&Bound<'_, PyAny>>,
    enable_reconfigure: bool,
    hints: Option<HashMap<String, String>>,
) -> PyResult<Py<PyTorchComm>> {
    // Backend discovery: entry points first (importing a backend's module registers it); a
    // failure only matters when nothing registered the name.
    if let Err(e) = py
        .import("torchcomms")
        .and_then(|m| m.call_method1("_load_backend", (backend,)))
    {
        if !_is_backend_registered(py, backend) {
            return Err(e);
        }
    }
    // Rust backends reconfigure by forming a new communicator; of the Python backends only
    // the fake one does (as upstream's `supportsReconfigure`).
    let is_fake = backend == crate::fake::NAME;
    let reconfigurable = is_fake
        || (py_backend(py, backend).is_none() && torchcomms::is_backend_registered(backend));
    if enable_reconfigure && !reconfigurable {
        return Err(PyRuntimeError::new_err(format!(
            "[TorchComm]: enable_reconfigure=true is not supported by backend: {backend}. Only \
             backends that implement supportsReconfigure() can use reconfigure for fault \
             tolerance."
        )));
    }
    let mut options = PyCommOptions::from_env()?;
    if let Some(a) = abort_process_on_timeout_or_error {
        options.abort_process_on_timeout_or_error = a;
    }
    if let Some(t) = timeout_arg(timeout, "new_comm")? {
        options.timeout = t;
    }
    if let Some(h) = is_high_priority_stream {
        options.is_high_priority_stream = h;
    }
    let store = store.filter(|s| !s.is_none());
    options.store = store.map(|s| s.clone().unbind());
    if let Some(h) = hints {
        options.hints = h;
    }
    options.enable_reconfigure = enable_reconfigure;
    let torch_device = py
        .import("torch")?
        .getattr("device")?
        .call1((device,))
        .map_err(|e| value_error(format!("new_comm: invalid argument `device`: {e}")))?;

    if let Some(cls) = py_backend(py, backend) {
        let instance = cls.call0(py)?;
        let opts = Py::new(py, options.copy(py))?;
        instance.call_method1(py, "init", (&torch_device, name, opts))?;
        return python_comm(py, instance.bind(py), backend, &torch_device, options);
    }
    if !torchcomms::is_backend_registered(backend) {
        return Err(no_factory(backend));
    }

    let dev = parse_device(&torch_device)?;
    let api_store = match store {
        Some(s) => Some(Arc::new(PyStore::new(s)?) as Arc<dyn torchcomms_core::bootstrap::Store>),
        None => None,
    };
    let api_opts = torchcomms::CommOptions {
        // The bindings abort the process themselves, after running the abort hooks.
        abort_process_on_timeout_or_error: false,
        timeout: options.timeout,
        store: api_store,
        hints: options.hints.clone().into_iter().collect(),
        rank: None,
        size: None,
        high_priority_stream: options.is_high_priority_stream,
        dedicated_store: false,
    };
    // A reconfigurable communicator starts alone; its first `reconfigure()` forms the group.
    let (comm, reconfigurer) = if enable_reconfigure && !is_fake {
        let r = torchcomms::Reconfigurer::new(backend, dev, name, api_opts).py()?;
        (py.detach(|| r.alone()).py()?, Some(r))
    } else {
        let comm = py
            .detach(|| torchcomms::new_comm(backend, dev, name, api_opts))
            .py()?;
        (comm, None)
    };
    let (rank, size) = (comm.get_rank(), comm.get_size());
    let core = CommCore::new(
        Backend::Native(NativeComm::new(comm)),
        backend,
        name,
        (rank, size),
        torch_device.unbind(),
        options,
    );
    Py::new(py, PyTorchComm::new(core, reconfigurer))
}
