//! The one place Rust errors become Python exceptions.
//!
//! Every error kind maps to a standard Python exception, and also derives from `RuntimeError`
//! (upstream torchcomms raises `RuntimeError` for everything its C++ layer throws, so code that
//! catches `RuntimeError` keeps working):
//!
//! | [`ErrorKind`]     | Python exception                                   |
//! |-------------------|----------------------------------------------------|
//! | `InvalidArgument` | `torchcomms.CommValueError(ValueError, RuntimeError)` |
//! | `Timeout`         | `torchcomms.CommTimeoutError(TimeoutError, RuntimeError)` |
//! | `Communication`   | `RuntimeError`                                      |
//! | `NotSupported`    | `NotImplementedError` (a `RuntimeError`)            |
//!
//! Wrong Python types (a dtype we do not handle, a list where a tensor belongs) raise
//! `torchcomms.CommTypeError(TypeError, RuntimeError)`.
//!
//! A Rust panic never reaches Python as pyo3's `PanicException` (a `BaseException`, which
//! `except Exception` does not catch): every entry point that reaches the engine runs inside
//! [`guard`], which turns a panic into `torchcomms.CommInternalError(RuntimeError)`. Panics are
//! bugs (bad arguments are checked before anything runs); this is the last line of defence.

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use torchcomms::{Error, ErrorKind};

/// A TorchComm API error with the rank that saw it (messages name the op already).
#[derive(Debug)]
pub(crate) struct CommError {
    pub(crate) error: Error,
    pub(crate) rank: Option<usize>,
}

impl From<Error> for CommError {
    fn from(error: Error) -> Self {
        CommError { error, rank: None }
    }
}

impl From<torchcomms_core::Error> for CommError {
    fn from(e: torchcomms_core::Error) -> Self {
        CommError::from(Error::Engine(e))
    }
}

impl From<CommError> for PyErr {
    fn from(e: CommError) -> PyErr {
        let text = e.error.to_string();
        let msg = match e.rank {
            // Engine messages already say "on rank N"; API messages name the op only.
            Some(r) if !text.contains(&format!("rank {r}")) => format!("[rank {r}] {text}"),
            _ => text,
        };
        Python::attach(|py| match e.error.kind() {
            ErrorKind::InvalidArgument => new_err(py, &VALUE_ERROR, msg),
            ErrorKind::Timeout => new_err(py, &TIMEOUT_ERROR, msg),
            ErrorKind::Communication => PyRuntimeError::new_err(msg),
            ErrorKind::NotSupported => PyNotImplementedError::new_err(msg),
        })
    }
}

/// Maps API results to Python results, naming the rank.
pub(crate) trait ResultExt<T> {
    /// Converts the error, tagging it with `rank`.
    fn on_rank(self, rank: usize) -> PyResult<T>;
    /// Converts the error without a rank (before a communicator exists).
    fn py(self) -> PyResult<T>;
}

impl<T, E: Into<CommError>> ResultExt<T> for Result<T, E> {
    fn on_rank(self, rank: usize) -> PyResult<T> {
        self.map_err(|e| {
            let mut c: CommError = e.into();
            c.rank = Some(rank);
            c.into()
        })
    }
    fn py(self) -> PyResult<T> {
        self.map_err(|e| e.into().into())
    }
}

static VALUE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TIMEOUT_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TYPE_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INTERNAL_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

fn make_type(py: Python<'_>, name: &str, base: &str, doc: &str) -> PyResult<Py<PyType>> {
    let builtins = py.import("builtins")?;
    let mut bases = vec![builtins.getattr(base)?];
    if base != "RuntimeError" {
        bases.push(builtins.getattr("RuntimeError")?);
    }
    let bases = PyTuple::new(py, bases)?;
    let ns = PyDict::new(py);
    ns.set_item("__module__", "torchcomms")?;
    ns.set_item("__doc__", doc)?;
    let ty = builtins.getattr("type")?.call1((name, bases, ns))?;
    Ok(ty.cast_into::<PyType>()?.unbind())
}

/// Creates the exception classes and adds them to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    for (cell, name, base, doc) in [
        (
            &VALUE_ERROR,
            "CommValueError",
            "ValueError",
            "A bad argument to a torchcomms call (also a RuntimeError, like upstream).",
        ),
        (
            &TIMEOUT_ERROR,
            "CommTimeoutError",
            "TimeoutError",
            "A torchcomms operation missed its deadline (also a RuntimeError).",
        ),
        (
            &TYPE_ERROR,
            "CommTypeError",
            "TypeError",
            "An argument of the wrong type or dtype (also a RuntimeError).",
        ),
        (
            &INTERNAL_ERROR,
            "CommInternalError",
            "RuntimeError",
            "A bug in torchcomms (a Rust panic), raised instead of crashing; the communicator \
             may be unusable afterwards.",
        ),
    ] {
        let ty = make_type(py, name, base, doc)?;
        let _ = cell.set(py, ty);
        m.add(name, cell.get(py).expect("just set").clone_ref(py))?;
    }
    Ok(())
}

fn new_err(py: Python<'_>, cell: &PyOnceLock<Py<PyType>>, msg: String) -> PyErr {
    match cell.get(py) {
        Some(ty) => PyErr::from_type(ty.bind(py).clone(), msg),
        None => PyRuntimeError::new_err(msg),
    }
}

/// Runs the body of a Python entry point `what`, turning a Rust panic into
/// `CommInternalError` (see the module documentation). The happy path costs nothing: unwinding
/// is only set up, never taken.
pub(crate) fn guard<T>(what: &str, f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    // Unwind safety: after a panic the state `f` touched may be inconsistent; the error says
    // so, and shared state is behind mutexes the next user recovers from poisoning.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            Err(Python::attach(|py| {
                new_err(
                    py,
                    &INTERNAL_ERROR,
                    format!(
                        "{what}: internal error (a bug in torchcomms, please report it): {why}"
                    ),
                )
            }))
        }
    }
}

/// A `CommTimeoutError` (a deadline the bindings' own calls missed).
pub(crate) fn timeout_error(msg: impl Into<String>) -> PyErr {
    Python::attach(|py| new_err(py, &TIMEOUT_ERROR, msg.into()))
}

/// A `CommValueError` (bad argument found by the bindings themselves).
pub(crate) fn value_error(msg: impl Into<String>) -> PyErr {
    Python::attach(|py| new_err(py, &VALUE_ERROR, msg.into()))
}

/// A colltrace dump that could not be written: `OSError` naming the file or directory.
pub(crate) fn colltrace_error(e: colltrace::Error) -> PyErr {
    pyo3::exceptions::PyOSError::new_err(e.to_string())
}

/// A `CommTypeError` (wrong Python type or unsupported dtype).
pub(crate) fn type_error(msg: impl Into<String>) -> PyErr {
    Python::attach(|py| new_err(py, &TYPE_ERROR, msg.into()))
}

/// Upstream's text for an operation a backend does not implement.
pub(crate) fn not_implemented(what: &str, comm: &str) -> PyErr {
    PyNotImplementedError::new_err(format!(
        "[TorchCommBackend]: {what} not implemented for communicator:{comm}"
    ))
}
