//! `TorchComm`: every operation checks its Python arguments, takes the next
//! process-wide op id, runs the pre-hooks, calls the backend with the GIL released, runs the
//! post-hooks (at enqueue, not completion) and returns a `TorchWork`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use torchcomms::{Error, ErrorKind, OpOptions, TorchComm, Work};

use crate::error::{not_implemented, value_error, ResultExt};
use crate::hooks::{self, HookKind, HookOwner, Hooks, RemovableHandle};
use crate::tensor::{seq_items, to_tensor, to_tensors};
use crate::types::{reduce_op_arg, timeout_arg, OpName, PyCommOptions};
use crate::work::{PyTorchWork, WorkInner};

/// What runs the operations of a communicator.
#[derive(Debug)]
pub(crate) enum Backend {
    /// A Rust backend (`ctran`).
    Native(NativeComm),
    /// An instance of a Python `TorchCommBackend` subclass (see `register_backend`).
    Python(Py<PyAny>),
}

/// An engine communicator that is dropped with the GIL released: dropping one without
/// `finalize()` lets its queued work finish first, which can take a while.
#[derive(Debug)]
pub(crate) struct NativeComm(Option<TorchComm>);

impl NativeComm {
    pub(crate) fn new(comm: TorchComm) -> Self {
        NativeComm(Some(comm))
    }
}

impl std::ops::Deref for NativeComm {
    type Target = TorchComm;
    fn deref(&self) -> &TorchComm {
        // Only `drop` takes the communicator out.
        self.0.as_ref().expect("communicator present until dropped")
    }
}

impl Drop for NativeComm {
    fn drop(&mut self) {
        let mut comm = self.0.take();
        let _ = Python::try_attach(|py| {
            let c = comm.take();
            py.detach(move || drop(c));
        });
        drop(comm); // not attached (the interpreter is shutting down): drop it here
    }
}

/// The communicator's default timeout and hints, which `set_timeout()`/`set_hints()` change.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) timeout: std::time::Duration,
    pub(crate) hints: HashMap<String, String>,
}

/// State shared by a `TorchComm`, its works, batches and hook handles.
#[derive(Debug)]
pub(crate) struct CommCore {
    pub(crate) backend: Backend,
    pub(crate) backend_name: String,
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    device: Py<PyAny>,
    options: PyCommOptions,
    /// What `set_timeout()`/`set_hints()` changed after creation.
    settings: Mutex<Settings>,
    hooks: Mutex<Hooks>,
    abort_hooks_ran: AtomicBool,
    user_aborted: AtomicBool,
}

impl CommCore {
    pub(crate) fn new(
        backend: Backend,
        backend_name: &str,
        name: &str,
        (rank, size): (usize, usize),
        device: Py<PyAny>,
        options: PyCommOptions,
    ) -> CommCore {
        CommCore {
            backend,
            backend_name: backend_name.to_string(),
            name: name.to_string(),
            rank,
            size,
            settings: Mutex::new(Settings {
                timeout: options.timeout,
                hints: options.hints.clone(),
            }),
            device,
            options,
            hooks: Mutex::new(Hooks::default()),
            abort_hooks_ran: AtomicBool::new(false),
            user_aborted: AtomicBool::new(false),
        }
    }
}

impl HookOwner for CommCore {
    fn hooks(&self) -> &Mutex<Hooks> {
        &self.hooks
    }
}

/// Which post-hook argument class an operation reports.
#[derive(Debug, Clone, Copy)]
enum PostKind {
    Collective,
    BatchIssue,
}

impl CommCore {
    /// Called with every error an operation of this communicator raises. A failure of the
    /// communicator itself (timeout, lost peer) runs the abort hooks once, then aborts the
    /// process when `abort_process_on_timeout_or_error` is set, like upstream's watchdog.
    /// Bad arguments and calls after `finalize()` or `abort()` do neither.
    pub(crate) fn on_failure(self: &Arc<Self>, py: Python<'_>, e: &Error) {
        if !self.is_fatal(e) {
            return;
        }
        crate::watchdog::set_unhealthy();
        if self.options.abort_process_on_timeout_or_error {
            crate::watchdog::abort_process(Some(py), self, e);
        }
        self.run_abort_hooks_once(py);
    }

    /// Whether this communicator aborts the process on a timeout or error.
    pub(crate) fn aborts_process(&self) -> bool {
        self.options.abort_process_on_timeout_or_error
    }

    /// Whether `e` breaks the communicator (a timeout, a lost peer) rather than reporting a bad
    /// argument, a call after `finalize()`, or the consequence of the user's own `abort()`.
    pub(crate) fn is_fatal(&self, e: &Error) -> bool {
        let after_finalize = matches!(
            e,
            Error::Finalized { .. } | Error::Engine(ctran::Error::Finalized { .. })
        );
        matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Communication)
            && !after_finalize
            && !self.user_aborted.load(Ordering::Acquire)
    }

    /// Runs the abort hooks unless they already ran for this communicator.
    pub(crate) fn run_abort_hooks_once(&self, py: Python<'_>) {
        if !self.abort_hooks_ran.swap(true, Ordering::AcqRel) {
            hooks::run_abort(py, self);
        }
    }

    /// The current default timeout and hints.
    pub(crate) fn settings(&self) -> Settings {
        self.settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn native(&self) -> Option<&TorchComm> {
        match &self.backend {
            Backend::Native(c) => Some(c),
            Backend::Python(_) => None,
        }
    }

    /// `[rank R] op`: how error messages name the operation.
    pub(crate) fn tag(&self, op: &str) -> String {
        format!("[rank {}] {op}", self.rank)
    }

    /// Checks a rank argument like upstream: "`root` must be in range [0, N), but got X".
    fn rank_arg(&self, op: &str, arg: &str, r: i64) -> PyResult<usize> {
        if r < 0 || r as u64 >= self.size as u64 {
            return Err(value_error(format!(
                "[rank {}] {op}: invalid argument `{arg}`: {arg} must be in range [0, {}), but \
                 got {r}",
                self.rank, self.size
            )));
        }
        Ok(r as usize)
    }

    /// On a CUDA communicator, the caller's current stream
    /// (`torch.cuda.current_stream(device).cuda_stream`): operations run after the work issued
    /// on it so far, as with ProcessGroupNCCL. `None` on CPU.
    fn caller_stream(&self) -> PyResult<Option<u64>> {
        Python::attach(|py| {
            let device = self.device.bind(py);
            if device.getattr("type")?.extract::<String>()? != "cuda" {
                return Ok(None);
            }
            let stream = py
                .import("torch")?
                .getattr("cuda")?
                .call_method1("current_stream", (device,))?;
            Ok(Some(stream.getattr("cuda_stream")?.extract::<u64>()?))
        })
    }

    fn op_options(
        &self,
        op: &str,
        async_op: bool,
        hints: Option<HashMap<String, String>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<OpOptions> {
        // Built from a constructor, so fields the API adds later keep their defaults.
        let mut o = if async_op {
            OpOptions::async_op()
        } else {
            OpOptions::sync()
        };
        let settings = self.settings();
        // The communicator's hints (`set_hints`), overridden by the operation's own.
        let mut all = settings.hints;
        all.extend(hints.unwrap_or_default());
        o.hints = all.into_iter().collect();
        // An operation without a timeout uses the communicator's (`set_timeout` changes it).
        o.timeout = Some(
            timeout_arg(timeout, &self.tag(op))?
                .filter(|t| !t.is_zero())
                .unwrap_or(settings.timeout),
        );
        o.stream = self.caller_stream()?;
        Ok(o)
    }

    /// The common path of every operation (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    fn issue<F>(
        self: &Arc<Self>,
        py: Python<'_>,
        name: OpName,
        pre: impl FnOnce(Python<'_>) -> PyResult<Py<PyAny>>,
        native: Option<F>,
        py_args: impl FnOnce(Python<'_>) -> PyResult<Py<PyTuple>>,
        post: PostKind,
    ) -> PyResult<Py<PyTorchWork>>
    where
        F: FnOnce(&TorchComm) -> torchcomms::Result<Work> + Send,
    {
        let op_id = hooks::next_op_id();
        hooks::run_pre(py, self.as_ref(), name, op_id, pre)?;
        let inner = match (&self.backend, native) {
            (Backend::Native(c), Some(f)) => match py.detach(|| f(c)) {
                Ok(w) => {
                    let w = Arc::new(w);
                    crate::watchdog::watch(&w, self);
                    WorkInner::Native(w)
                }
                Err(e) => {
                    self.on_failure(py, &e);
                    return Err(e).on_rank(self.rank);
                }
            },
            (Backend::Python(b), _) => {
                let b = b.bind(py);
                if matches!(name, OpName::BatchOpIssue) {
                    return Err(PyNotImplementedError::new_err(
                        "[PyTorchCommBackend]: batch_op_issue not implemented for Python backends",
                    ));
                }
                if !b.hasattr(name.as_str())? {
                    return Err(not_implemented(name.as_str(), &self.name));
                }
                let r = b.call_method1(name.as_str(), py_args(py)?.bind(py).clone())?;
                if r.is_none() {
                    WorkInner::Done
                } else {
                    WorkInner::Python {
                        obj: r.unbind(),
                        status: Mutex::new(crate::types::WorkStatus::InProgress),
                    }
                }
            }
            (Backend::Native(_), None) => {
                return Err(PyRuntimeError::new_err("internal error: no native call"))
            }
        };
        let work = Py::new(py, PyTorchWork::new(inner, Arc::clone(self)))?;
        hooks::run_post(py, self.as_ref(), op_id, |py| {
            let w = work.clone_ref(py).into_any();
            Ok(match post {
                PostKind::Collective => {
                    Py::new(py, hooks::CollectivePostHookArgs { work: w })?.into_any()
                }
                PostKind::BatchIssue => {
                    Py::new(py, hooks::BatchOpIssuePostHookArgs { work: w })?.into_any()
                }
            })
        })?;
        Ok(work)
    }
}

/// A communicator (upstream's `TorchComm`). Create one with `new_comm`; call `finalize()`
/// before dropping it (dropping without `finalize()` does not abort the job).
#[pyclass(module = "torchcomms._comms", name = "TorchComm", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct PyTorchComm {
    pub(crate) core: Arc<CommCore>,
}

fn obj(b: &Bound<'_, PyAny>) -> Py<PyAny> {
    b.clone().unbind()
}

fn pybool(py: Python<'_>, v: bool) -> Py<PyAny> {
    pyo3::types::PyBool::new(py, v)
        .to_owned()
        .into_any()
        .unbind()
}

fn pyint(py: Python<'_>, v: i64) -> PyResult<Py<PyAny>> {
    Ok(v.into_pyobject(py)?.into_any().unbind())
}

fn tuple<'py>(py: Python<'py>, items: Vec<Py<PyAny>>) -> PyResult<Py<PyTuple>> {
    Ok(PyTuple::new(py, items)?.unbind())
}

fn pre<T: pyo3::PyClass + Into<pyo3::PyClassInitializer<T>>>(
    py: Python<'_>,
    v: T,
) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, v)?.into_any())
}

/// Split sizes: non-negative integers.
fn splits(obj: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Vec<usize>> {
    let v: Vec<i64> = obj.extract().map_err(|_| {
        crate::error::type_error(format!("{op}: argument `{arg}` must be a list of int"))
    })?;
    v.iter()
        .map(|&x| {
            usize::try_from(x).map_err(|_| {
                value_error(format!(
                    "{op}: invalid argument `{arg}`: split sizes must be >= 0, got {x}"
                ))
            })
        })
        .collect()
}

pub(crate) type Hints = Option<HashMap<String, String>>;

#[pymethods]
impl PyTorchComm {
    // ----- accessors -----

    /// This rank.
    fn get_rank(&self) -> usize {
        self.core.rank
    }
    /// Number of ranks.
    fn get_size(&self) -> usize {
        self.core.size
    }
    /// The name given at creation.
    fn get_name(&self) -> &str {
        &self.core.name
    }
    /// A copy of the options this communicator was created with.
    fn get_options(&self, py: Python<'_>) -> PyCommOptions {
        let mut o = self.core.options.copy(py);
        let s = self.core.settings();
        o.timeout = s.timeout;
        o.hints = s.hints;
        o
    }
    /// The `torch.device` this communicator serves.
    fn get_device(&self, py: Python<'_>) -> Py<PyAny> {
        self.core.device.clone_ref(py)
    }
    /// The backend name given to `new_comm` (inherited by split children).
    fn get_backend(&self) -> &str {
        &self.core.backend_name
    }
    /// Version of the engine behind the backend.
    fn get_backend_version(&self, py: Python<'_>) -> PyResult<String> {
        match &self.core.backend {
            Backend::Native(c) => c.get_backend_version().on_rank(self.core.rank),
            Backend::Python(b) => {
                if b.bind(py).hasattr("get_backend_version")? {
                    b.call_method0(py, "get_backend_version")?.extract(py)
                } else {
                    Err(not_implemented("version", &self.core.name))
                }
            }
        }
    }
    /// The backend object (a Python backend's instance; this communicator for Rust backends).
    fn get_backend_impl(slf: &Bound<'_, Self>) -> Py<PyAny> {
        match &slf.get().core.backend {
            Backend::Python(b) => b.clone_ref(slf.py()),
            Backend::Native(_) => slf.clone().into_any().unbind(),
        }
    }
    /// Deprecated alias of `get_backend_impl()`.
    fn unsafe_get_backend(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let warnings = py.import("warnings")?;
        warnings.call_method1(
            "warn",
            (
                "unsafe_get_backend() is deprecated, use get_backend_impl() instead.",
                py.get_type::<pyo3::exceptions::PyDeprecationWarning>(),
                2,
            ),
        )?;
        Ok(Self::get_backend_impl(slf))
    }
    /// Not supported by this build (dynamic-regime communicators).
    fn get_init_handle(&self) -> PyResult<String> {
        Err(not_implemented("getInitHandle", &self.core.name))
    }
    /// Re-forms the communicator from `init_handles` (a collective of the new members). Only
    /// the `fake` backend implements it (its work completes at once); `ctran` raises.
    #[pyo3(signature = (uuid, init_handles, timeout=None, hints=None))]
    fn reconfigure(
        &self,
        py: Python<'_>,
        uuid: i64,
        init_handles: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        hints: Hints,
    ) -> PyResult<Py<PyTorchWork>> {
        let _ = hints;
        let op = "reconfigure";
        let handles_ok = (init_handles.is_instance_of::<PyList>()
            || init_handles.is_instance_of::<pyo3::types::PySet>())
            && init_handles.try_iter()?.all(|h| {
                h.map(|h| h.is_instance_of::<pyo3::types::PyString>())
                    .unwrap_or(false)
            });
        if !handles_ok {
            return Err(crate::error::type_error(format!(
                "{}: argument `init_handles` must be a list or set of str",
                self.core.tag(op)
            )));
        }
        if uuid < 0 {
            return Err(value_error(format!(
                "{}: invalid argument `uuid`: expected a non-negative int, got {uuid}",
                self.core.tag(op)
            )));
        }
        timeout_arg(timeout, &self.core.tag(op))?;
        if self.core.backend_name != crate::fake::NAME || !self.core.options.enable_reconfigure {
            return Err(not_implemented(op, &self.core.name));
        }
        Py::new(
            py,
            PyTorchWork::new(WorkInner::Done, Arc::clone(&self.core)),
        )
    }
    /// Sets the default timeout of later operations (those called without `timeout=`).
    fn set_timeout(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = timeout_arg(Some(timeout), &self.core.tag("set_timeout"))?.ok_or_else(|| {
            crate::error::type_error(format!(
                "{}: argument `timeout` must be a datetime.timedelta, got None",
                self.core.tag("set_timeout")
            ))
        })?;
        if let Backend::Python(b) = &self.core.backend {
            if !b.bind(py).hasattr("set_timeout")? {
                return Err(not_implemented("setTimeout", &self.core.name));
            }
            b.call_method1(py, "set_timeout", (timeout,))?;
        }
        self.core
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .timeout = t;
        Ok(())
    }
    /// Replaces the communicator's hints: later operations see them (their own `hints=`
    /// override single keys).
    fn set_hints(&self, py: Python<'_>, hints: &Bound<'_, PyAny>) -> PyResult<()> {
        let h: HashMap<String, String> = hints.extract().map_err(|_| {
            crate::error::type_error(format!(
                "{}: argument `hints` must be a dict[str, str]",
                self.core.tag("set_hints")
            ))
        })?;
        if let Backend::Python(b) = &self.core.backend {
            if !b.bind(py).hasattr("set_hints")? {
                return Err(not_implemented("setHints", &self.core.name));
            }
            b.call_method1(py, "set_hints", (hints,))?;
        }
        self.core
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .hints = h;
        Ok(())
    }
    /// Registers a tensor's memory with the backend: CPU tensors need no registration, so this
    /// only checks the tensor.
    fn tensor_register(&self, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.core.native().is_some() {
            to_tensor(tensor, "tensor_register", "tensor")?;
        }
        Ok(())
    }
    /// Counterpart of `tensor_register()`.
    fn tensor_deregister(&self, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.core.native().is_some() {
            to_tensor(tensor, "tensor_deregister", "tensor")?;
        }
        Ok(())
    }
    /// Not supported by this build (no memory allocator for CPU communicators).
    fn get_mem_allocator(&self) -> PyResult<()> {
        Err(no_allocator(&self.core.backend_name))
    }
    /// Deprecated alias of `get_mem_allocator()`.
    #[getter(mem_allocator)]
    fn mem_allocator_attr(&self) -> PyResult<()> {
        Err(no_allocator(&self.core.backend_name))
    }
    /// Not supported by this build.
    fn get_device_transport(&self) -> PyResult<()> {
        Err(not_implemented("get_device_transport", &self.core.name))
    }
    /// Not supported by this build (windows need a GPU backend).
    #[pyo3(signature = (tensor=None))]
    fn new_window(&self, tensor: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let _ = tensor;
        Err(not_implemented("new_window", &self.core.name))
    }
    /// NCCLX only.
    #[pyo3(signature = (output, hints=None, timeout=None))]
    fn all_gather_p_init(
        &self,
        output: &Bound<'_, PyAny>,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = (output, hints, timeout);
        Err(not_implemented("all_gather_p_init", &self.core.name))
    }
    /// NCCLX only.
    #[pyo3(signature = (handle, input, async_op, hints=None, timeout=None))]
    fn all_gather_p_exec(
        &self,
        handle: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let _ = (handle, input, async_op, hints, timeout);
        Err(not_implemented("all_gather_p_exec", &self.core.name))
    }
    /// NCCLX only.
    fn all_gather_p_free(&self, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let _ = handle;
        Err(not_implemented("all_gather_p_free", &self.core.name))
    }

    // ----- lifecycle -----

    /// Waits for outstanding work and releases the communicator. Hooks see op id 2**64-1;
    /// no op id is consumed. A second call does nothing.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let core = &self.core;
        let id = hooks::FINALIZE_OP_ID;
        hooks::run_pre(py, core.as_ref(), OpName::Finalize, id, |py| {
            pre(py, hooks::FinalizePreHookArgs {})
        })?;
        match &core.backend {
            Backend::Native(c) => {
                if let Err(e) = py.detach(|| c.finalize()) {
                    core.on_failure(py, &e);
                    return Err(e).on_rank(core.rank);
                }
            }
            Backend::Python(b) => {
                b.call_method0(py, "finalize")?;
            }
        }
        hooks::run_post(py, core.as_ref(), id, |py| {
            pre(py, hooks::FinalizePostHookArgs {})
        })
    }

    /// Fails outstanding and future operations and closes connections; peers see this rank
    /// leave. Runs the abort hooks.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let core = &self.core;
        core.user_aborted.store(true, Ordering::Release);
        if !core.abort_hooks_ran.swap(true, Ordering::AcqRel) {
            hooks::run_abort(py, core.as_ref());
        }
        match &core.backend {
            Backend::Native(c) => py.detach(|| c.abort()).on_rank(core.rank),
            Backend::Python(b) => {
                if b.bind(py).hasattr("abort")? {
                    b.call_method0(py, "abort")?;
                    Ok(())
                } else {
                    Err(not_implemented("abort", &core.name))
                }
            }
        }
    }

    /// Writes this communicator's colltrace (its last operations, sequence numbers and states;
    /// schema `docs/colltrace-schema.md`) as JSON into `dir` (default: the cvar
    /// `TORCHCOMMS_TRACE_DIR`), as `colltrace_rank<N>_<name>_<instance>.json`, and returns the
    /// file's path (the Rust API's `Comm::dump_trace`). `comms-analyzer report DIR` reads the
    /// files of every rank.
    #[pyo3(signature = (dir=None))]
    fn dump_trace(&self, py: Python<'_>, dir: Option<std::path::PathBuf>) -> PyResult<String> {
        let core = &self.core;
        if let Backend::Python(_) = core.backend {
            return Err(PyNotImplementedError::new_err(format!(
                "dump_trace on communicator {}: backend {} is written in Python and keeps no \
                 colltrace",
                core.name, core.backend_name
            )));
        }
        let Some(trace) = colltrace::find(&core.name, core.rank) else {
            return Err(PyRuntimeError::new_err(format!(
                "dump_trace on communicator {}, rank {}: no colltrace (tracing is off with \
                 TORCHCOMMS_TRACE_BUFFER_SIZE=0, or backend {} records none)",
                core.name, core.rank, core.backend_name
            )));
        };
        let dir = dir.unwrap_or_else(colltrace::trace_dir);
        let path = py
            .detach(|| trace.dump_to(&dir, colltrace::Trigger::Api, Some("TorchComm.dump_trace")))
            .map_err(crate::error::colltrace_error)?;
        Ok(path.to_string_lossy().into_owned())
    }

    /// Whether `abort()` is implemented.
    fn is_abort_supported(&self) -> bool {
        match &self.core.backend {
            Backend::Native(c) => c.is_abort_supported(),
            Backend::Python(_) => false,
        }
    }

    /// True once aborted.
    fn is_aborted(&self) -> bool {
        match &self.core.backend {
            Backend::Native(c) => c.is_aborted(),
            Backend::Python(_) => self.core.user_aborted.load(Ordering::Acquire),
        }
    }

    /// `cb(name: OpName, op_id: int, args)` runs before each operation, on the calling thread.
    fn register_pre_hook(&self, callback: Py<PyAny>) -> RemovableHandle {
        self.register(HookKind::Pre, callback)
    }
    /// `cb(op_id: int, args)` runs when each operation was enqueued (not completed).
    fn register_post_hook(&self, callback: Py<PyAny>) -> RemovableHandle {
        self.register(HookKind::Post, callback)
    }
    /// `cb()` runs once before the communicator gives up on a timeout or error (and before
    /// the process aborts when `abort_process_on_timeout_or_error` is set).
    fn register_abort_hook(&self, callback: Py<PyAny>) -> RemovableHandle {
        self.register(HookKind::Abort, callback)
    }

    // Hooks often close over objects that hold this communicator (a clog keeps its comms):
    // let the garbage collector see through them.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // Hook lists are only locked briefly by threads that are attached; never block here.
        if let Ok(h) = self.core.hooks.try_lock() {
            for cb in h.all() {
                visit.call(cb)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        self.core
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    fn __copy__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> Py<Self> {
        slf
    }
    fn __repr__(&self) -> String {
        format!(
            "TorchComm(name={:?}, backend={:?}, rank={}, size={})",
            self.core.name, self.core.backend_name, self.core.rank, self.core.size
        )
    }

    // ----- point-to-point -----

    /// Sends `tensor` to rank `dst`.
    #[pyo3(signature = (tensor, dst, async_op, hints=None, timeout=None))]
    fn send(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        dst: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.p2p(
            py,
            OpName::Send,
            "dst",
            tensor,
            dst,
            async_op,
            hints,
            timeout,
        )
    }

    /// Receives into `tensor` from rank `src`.
    #[pyo3(signature = (tensor, src, async_op, hints=None, timeout=None))]
    fn recv(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        src: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.p2p(
            py,
            OpName::Recv,
            "src",
            tensor,
            src,
            async_op,
            hints,
            timeout,
        )
    }

    // ----- rooted and reductions -----

    /// Broadcasts `root`'s `tensor` to every rank, in place.
    #[pyo3(signature = (tensor, root, async_op, hints=None, timeout=None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let op = "broadcast";
        let root_u = c.rank_arg(op, "root", root)?;
        let opts = c.op_options(op, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let t = to_tensor(tensor, &c.tag(op), "tensor")?;
                Some(move |comm: &TorchComm| comm.broadcast(&t, root_u, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::Broadcast,
            |py| {
                pre(
                    py,
                    hooks::BroadcastPreHookArgs {
                        tensor: obj(tensor),
                        root: pyint(py, root)?,
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![obj(tensor), pyint(py, root)?, pybool(py, async_op)],
                )
            },
            PostKind::Collective,
        )
    }

    /// Reduces `tensor` over all ranks, in place.
    #[pyo3(signature = (tensor, op, async_op, hints=None, timeout=None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "all_reduce";
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let t = to_tensor(tensor, &c.tag(name), "tensor")?;
                let rop = reduce_op_arg(op, &c.tag(name))?;
                Some(move |comm: &TorchComm| comm.all_reduce(&t, rop, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::AllReduce,
            |py| {
                pre(
                    py,
                    hooks::AllReducePreHookArgs {
                        tensor: obj(tensor),
                        async_op: pybool(py, async_op),
                        red_op: obj(op),
                    },
                )
            },
            native,
            |py| tuple(py, vec![obj(tensor), obj(op), pybool(py, async_op)]),
            PostKind::Collective,
        )
    }

    /// Reduces `tensor` onto `root` (other ranks' tensors are left unchanged).
    #[pyo3(signature = (tensor, root, op, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        root: i64,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "reduce";
        let root_u = c.rank_arg(name, "root", root)?;
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let t = to_tensor(tensor, &c.tag(name), "tensor")?;
                let rop = reduce_op_arg(op, &c.tag(name))?;
                Some(move |comm: &TorchComm| comm.reduce(&t, root_u, rop, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::Reduce,
            |py| {
                pre(
                    py,
                    hooks::ReducePreHookArgs {
                        tensor: obj(tensor),
                        root: pyint(py, root)?,
                        async_op: pybool(py, async_op),
                        red_op: obj(op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![obj(tensor), pyint(py, root)?, obj(op), pybool(py, async_op)],
                )
            },
            PostKind::Collective,
        )
    }

    // ----- gathers -----

    /// Gathers every rank's `tensor` into `tensor_list` (one tensor per rank, equal sizes).
    #[pyo3(signature = (tensor_list, tensor, async_op, hints=None, timeout=None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        tensor_list: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.gather_like(
            py,
            OpName::AllGather,
            tensor_list,
            tensor,
            async_op,
            hints,
            timeout,
        )
    }

    /// Like `all_gather`, with a different size per rank.
    #[pyo3(signature = (tensor_list, tensor, async_op, hints=None, timeout=None))]
    fn all_gather_v(
        &self,
        py: Python<'_>,
        tensor_list: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.gather_like(
            py,
            OpName::AllGatherV,
            tensor_list,
            tensor,
            async_op,
            hints,
            timeout,
        )
    }

    /// Gathers every rank's `input` into `output` (size x input's elements, rank order).
    #[pyo3(signature = (output, input, async_op, hints=None, timeout=None))]
    fn all_gather_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.single_io(
            py,
            OpName::AllGatherSingle,
            output,
            input,
            None,
            async_op,
            hints,
            timeout,
        )
    }

    // ----- reduce-scatter -----

    /// Reduces `input_list` (one tensor per rank) over all ranks; this rank gets block `rank`.
    #[pyo3(signature = (output, input_list, op, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input_list: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.reduce_scatter_like(
            py,
            OpName::ReduceScatter,
            output,
            input_list,
            op,
            async_op,
            hints,
            timeout,
        )
    }

    /// Like `reduce_scatter`, with a different size per rank.
    #[pyo3(signature = (output, input_list, op, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_v(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input_list: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.reduce_scatter_like(
            py,
            OpName::ReduceScatterV,
            output,
            input_list,
            op,
            async_op,
            hints,
            timeout,
        )
    }

    /// Reduces `input` (size blocks of `output`'s size) over all ranks; this rank gets block
    /// `rank`.
    #[pyo3(signature = (output, input, op, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.single_io(
            py,
            OpName::ReduceScatterSingle,
            output,
            input,
            Some(op),
            async_op,
            hints,
            timeout,
        )
    }

    // ----- all-to-all -----

    /// Block `j` of `input` goes to rank `j`; block `i` of `output` comes from rank `i`.
    #[pyo3(signature = (output, input, async_op, hints=None, timeout=None))]
    fn all_to_all_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        self.single_io(
            py,
            OpName::AllToAllSingle,
            output,
            input,
            None,
            async_op,
            hints,
            timeout,
        )
    }

    /// All-to-all with split sizes counted in rows of dimension 0 (output first).
    #[pyo3(signature = (output, input, output_split_sizes, input_split_sizes, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn all_to_all_v_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        output_split_sizes: &Bound<'_, PyAny>,
        input_split_sizes: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "all_to_all_v_single";
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let out_splits = splits(output_split_sizes, &c.tag(name), "output_split_sizes")?;
        let in_splits = splits(input_split_sizes, &c.tag(name), "input_split_sizes")?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensor(output, &c.tag(name), "output")?;
                let i = to_tensor(input, &c.tag(name), "input")?;
                let (os, is) = (out_splits.clone(), in_splits.clone());
                Some(move |comm: &TorchComm| comm.all_to_all_v_single(&o, &i, &os, &is, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::AllToAllVSingle,
            |py| {
                pre(
                    py,
                    hooks::AllToAllVSinglePreHookArgs {
                        input: obj(input),
                        output: obj(output),
                        input_split_sizes: PyList::new(py, &in_splits)?.into_any().unbind(),
                        output_split_sizes: PyList::new(py, &out_splits)?.into_any().unbind(),
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![
                        obj(output),
                        obj(input),
                        PyList::new(py, &out_splits)?.into_any().unbind(),
                        PyList::new(py, &in_splits)?.into_any().unbind(),
                        pybool(py, async_op),
                    ],
                )
            },
            PostKind::Collective,
        )
    }

    /// `input_tensor_list[j]` goes to rank `j`; `output_tensor_list[i]` comes from rank `i`.
    #[pyo3(signature = (output_tensor_list, input_tensor_list, async_op, hints=None, timeout=None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        output_tensor_list: &Bound<'_, PyAny>,
        input_tensor_list: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "all_to_all";
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensors(output_tensor_list, &c.tag(name), "output_tensor_list")?;
                let i = to_tensors(input_tensor_list, &c.tag(name), "input_tensor_list")?;
                Some(move |comm: &TorchComm| comm.all_to_all(&o, &i, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::AllToAll,
            |py| {
                pre(
                    py,
                    hooks::AllToAllPreHookArgs {
                        input: list_copy(py, input_tensor_list, &c.tag(name), "input_tensor_list")?,
                        output: list_copy(
                            py,
                            output_tensor_list,
                            &c.tag(name),
                            "output_tensor_list",
                        )?,
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![
                        obj(output_tensor_list),
                        obj(input_tensor_list),
                        pybool(py, async_op),
                    ],
                )
            },
            PostKind::Collective,
        )
    }

    /// Blocks until every rank reached the barrier.
    #[pyo3(signature = (async_op, hints=None, timeout=None))]
    fn barrier(
        &self,
        py: Python<'_>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let opts = c.op_options("barrier", async_op, hints, timeout)?;
        let native = c
            .native()
            .map(|_| move |comm: &TorchComm| comm.barrier(&opts));
        c.issue(
            py,
            OpName::Barrier,
            |py| {
                pre(
                    py,
                    hooks::BarrierPreHookArgs {
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| tuple(py, vec![pybool(py, async_op)]),
            PostKind::Collective,
        )
    }

    /// Scatters `root`'s `input_tensor_list` (one tensor per rank; other ranks may pass `[]`).
    #[pyo3(signature = (output_tensor, input_tensor_list, root, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        py: Python<'_>,
        output_tensor: &Bound<'_, PyAny>,
        input_tensor_list: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "scatter";
        let root_u = c.rank_arg(name, "root", root)?;
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensor(output_tensor, &c.tag(name), "output_tensor")?;
                let i = to_tensors(input_tensor_list, &c.tag(name), "input_tensor_list")?;
                Some(move |comm: &TorchComm| comm.scatter(&o, &i, root_u, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::Scatter,
            |py| {
                pre(
                    py,
                    hooks::ScatterPreHookArgs {
                        output: obj(output_tensor),
                        input: list_copy(py, input_tensor_list, &c.tag(name), "input_tensor_list")?,
                        root: pyint(py, root)?,
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![
                        obj(output_tensor),
                        obj(input_tensor_list),
                        pyint(py, root)?,
                        pybool(py, async_op),
                    ],
                )
            },
            PostKind::Collective,
        )
    }

    /// Gathers every rank's `input_tensor` into `root`'s `output_tensor_list` (other ranks may
    /// pass `[]`).
    #[pyo3(signature = (output_tensor_list, input_tensor, root, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn gather(
        &self,
        py: Python<'_>,
        output_tensor_list: &Bound<'_, PyAny>,
        input_tensor: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "gather";
        let root_u = c.rank_arg(name, "root", root)?;
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensors(output_tensor_list, &c.tag(name), "output_tensor_list")?;
                let i = to_tensor(input_tensor, &c.tag(name), "input_tensor")?;
                Some(move |comm: &TorchComm| comm.gather(&o, &i, root_u, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::Gather,
            |py| {
                pre(
                    py,
                    hooks::GatherPreHookArgs {
                        input: obj(input_tensor),
                        output: list_copy(
                            py,
                            output_tensor_list,
                            &c.tag(name),
                            "output_tensor_list",
                        )?,
                        root: pyint(py, root)?,
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![
                        obj(output_tensor_list),
                        obj(input_tensor),
                        pyint(py, root)?,
                        pybool(py, async_op),
                    ],
                )
            },
            PostKind::Collective,
        )
    }

    /// Gathers every rank's `input` into `root`'s `output` (size blocks along dim 0).
    #[pyo3(signature = (output, input, root, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn gather_single(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        root: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "gather_single";
        let root_u = c.rank_arg(name, "root", root)?;
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensor(output, &c.tag(name), "output")?;
                let i = to_tensor(input, &c.tag(name), "input")?;
                Some(move |comm: &TorchComm| comm.gather_single(&o, &i, root_u, &opts))
            }
            None => None,
        };
        c.issue(
            py,
            OpName::GatherSingle,
            |py| {
                pre(
                    py,
                    hooks::GatherSinglePreHookArgs {
                        input: obj(input),
                        output: obj(output),
                        root: pyint(py, root)?,
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![
                        obj(output),
                        obj(input),
                        pyint(py, root)?,
                        pybool(py, async_op),
                    ],
                )
            },
            PostKind::Collective,
        )
    }

    // ----- communicator management -----

    /// Splits off a communicator of `ranks` (ranks of this communicator). Every rank calls it;
    /// ranks passing `[]` get None. The child's rank is this rank's index in `ranks`; it gets
    /// fresh default options plus `hints`/`timeout`, and no hooks.
    #[pyo3(signature = (ranks, name, hints=None, timeout=None))]
    fn split(
        &self,
        py: Python<'_>,
        ranks: &Bound<'_, PyAny>,
        name: &str,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyTorchComm>>> {
        let c = &self.core;
        let list: Vec<i64> = ranks.extract().map_err(|_| {
            crate::error::type_error(format!(
                "split: argument `ranks` must be a list of int, got {}",
                ranks
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        let mut ranks_u = Vec::with_capacity(list.len());
        for &r in &list {
            ranks_u.push(c.rank_arg("split", "ranks", r)?);
        }
        let mut child_opts = PyCommOptions::from_env()?;
        if let Some(h) = &hints {
            child_opts.hints = h.clone();
        }
        if let Some(t) = timeout_arg(timeout, "split")? {
            child_opts.timeout = t;
        }
        let op_id = hooks::next_op_id();
        hooks::run_pre(py, c.as_ref(), OpName::Split, op_id, |py| {
            pre(
                py,
                hooks::SplitPreHookArgs {
                    ranks: PyList::new(py, &list)?.into_any().unbind(),
                    name: name.into_pyobject(py)?.into_any().unbind(),
                },
            )
        })?;
        let child: Option<Py<PyTorchComm>> = match &c.backend {
            Backend::Native(comm) => {
                let api_opts = torchcomms::CommOptions {
                    abort_process_on_timeout_or_error: false,
                    timeout: child_opts.timeout,
                    store: None,
                    hints: child_opts.hints.clone().into_iter().collect(),
                    rank: None,
                    size: None,
                    high_priority_stream: false,
                };
                let r = py.detach(|| comm.split(&ranks_u, name, Some(api_opts)));
                match r {
                    Ok(Some(child)) => {
                        let rank = child.get_rank();
                        let size = child.get_size();
                        let core = CommCore::new(
                            Backend::Native(NativeComm::new(child)),
                            &c.backend_name,
                            name,
                            (rank, size),
                            c.device.clone_ref(py),
                            child_opts,
                        );
                        Some(Py::new(
                            py,
                            PyTorchComm {
                                core: Arc::new(core),
                            },
                        )?)
                    }
                    Ok(None) => None,
                    Err(e) => {
                        c.on_failure(py, &e);
                        return Err(e).on_rank(c.rank);
                    }
                }
            }
            Backend::Python(b) => {
                let opts = Py::new(py, child_opts.copy(py))?;
                let r = b.call_method1(py, "split", (list.clone(), name, opts))?;
                if r.is_none(py) {
                    None
                } else {
                    Some(crate::create::python_comm(
                        py,
                        r.bind(py),
                        &c.backend_name,
                        c.device.bind(py),
                        child_opts,
                    )?)
                }
            }
        };
        let new_comm = match &child {
            Some(ch) => ch.clone_ref(py).into_any(),
            None => py.None(),
        };
        hooks::run_post(py, c.as_ref(), op_id, |py| {
            pre(py, hooks::SplitPostHookArgs { new_comm })
        })?;
        Ok(child)
    }

    /// Starts a batch of point-to-point operations that run concurrently.
    fn batch_op_create(slf: &Bound<'_, Self>) -> crate::batch::PyBatchSendRecv {
        crate::batch::PyBatchSendRecv::new(slf.clone().unbind())
    }
}

pub(crate) fn no_allocator(backend: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "No allocator factory registered for backend: {backend}"
    ))
}

/// A fresh Python list of the items of a list argument (hook args never alias the caller's
/// list).
fn list_copy(py: Python<'_>, l: &Bound<'_, PyAny>, op: &str, arg: &str) -> PyResult<Py<PyAny>> {
    Ok(PyList::new(py, seq_items(l, op, arg)?)?.into_any().unbind())
}

impl PyTorchComm {
    fn register(&self, kind: HookKind, cb: Py<PyAny>) -> RemovableHandle {
        let id = self
            .core
            .hooks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(kind, cb);
        let owner: Arc<dyn HookOwner> = self.core.clone();
        let weak: Weak<dyn HookOwner> = Arc::downgrade(&owner);
        RemovableHandle::new(weak, id)
    }

    #[allow(clippy::too_many_arguments)]
    fn p2p(
        &self,
        py: Python<'_>,
        which: OpName,
        peer_arg: &str,
        tensor: &Bound<'_, PyAny>,
        peer: i64,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = which.as_str();
        let peer_u = c.rank_arg(name, peer_arg, peer)?;
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let t = to_tensor(tensor, &c.tag(name), "tensor")?;
                let send = matches!(which, OpName::Send);
                Some(move |comm: &TorchComm| {
                    if send {
                        comm.send(&t, peer_u, &opts)
                    } else {
                        comm.recv(&t, peer_u, &opts)
                    }
                })
            }
            None => None,
        };
        c.issue(
            py,
            which,
            |py| {
                let (tensor, peer, async_op) =
                    (obj(tensor), pyint(py, peer)?, pybool(py, async_op));
                if matches!(which, OpName::Send) {
                    pre(
                        py,
                        hooks::SendPreHookArgs {
                            tensor,
                            peer,
                            async_op,
                        },
                    )
                } else {
                    pre(
                        py,
                        hooks::RecvPreHookArgs {
                            tensor,
                            peer,
                            async_op,
                        },
                    )
                }
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![obj(tensor), pyint(py, peer)?, pybool(py, async_op)],
                )
            },
            PostKind::Collective,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn gather_like(
        &self,
        py: Python<'_>,
        which: OpName,
        tensor_list: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = which.as_str();
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let outs = to_tensors(tensor_list, &c.tag(name), "tensor_list")?;
                let t = to_tensor(tensor, &c.tag(name), "tensor")?;
                let v = matches!(which, OpName::AllGatherV);
                Some(move |comm: &TorchComm| {
                    if v {
                        comm.all_gather_v(&outs, &t, &opts)
                    } else {
                        comm.all_gather(&outs, &t, &opts)
                    }
                })
            }
            None => None,
        };
        c.issue(
            py,
            which,
            |py| {
                let (input, output, a) = (
                    obj(tensor),
                    list_copy(py, tensor_list, &c.tag(name), "tensor_list")?,
                    pybool(py, async_op),
                );
                if matches!(which, OpName::AllGatherV) {
                    pre(
                        py,
                        hooks::AllGatherVPreHookArgs {
                            input,
                            output,
                            async_op: a,
                        },
                    )
                } else {
                    pre(
                        py,
                        hooks::AllGatherPreHookArgs {
                            input,
                            output,
                            async_op: a,
                        },
                    )
                }
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![obj(tensor_list), obj(tensor), pybool(py, async_op)],
                )
            },
            PostKind::Collective,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter_like(
        &self,
        py: Python<'_>,
        which: OpName,
        output: &Bound<'_, PyAny>,
        input_list: &Bound<'_, PyAny>,
        op: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = which.as_str();
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensor(output, &c.tag(name), "output")?;
                let ins = to_tensors(input_list, &c.tag(name), "input_list")?;
                let rop = reduce_op_arg(op, &c.tag(name))?;
                let v = matches!(which, OpName::ReduceScatterV);
                Some(move |comm: &TorchComm| {
                    if v {
                        comm.reduce_scatter_v(&o, &ins, rop, &opts)
                    } else {
                        comm.reduce_scatter(&o, &ins, rop, &opts)
                    }
                })
            }
            None => None,
        };
        c.issue(
            py,
            which,
            |py| {
                let (input, out, a, r) = (
                    list_copy(py, input_list, &c.tag(name), "input_list")?,
                    obj(output),
                    pybool(py, async_op),
                    obj(op),
                );
                if matches!(which, OpName::ReduceScatterV) {
                    pre(
                        py,
                        hooks::ReduceScatterVPreHookArgs {
                            input,
                            output: out,
                            async_op: a,
                            red_op: r,
                        },
                    )
                } else {
                    pre(
                        py,
                        hooks::ReduceScatterPreHookArgs {
                            input,
                            output: out,
                            async_op: a,
                            red_op: r,
                        },
                    )
                }
            },
            native,
            |py| {
                tuple(
                    py,
                    vec![obj(output), obj(input_list), obj(op), pybool(py, async_op)],
                )
            },
            PostKind::Collective,
        )
    }

    /// all_gather_single, reduce_scatter_single (with `op`) and all_to_all_single.
    #[allow(clippy::too_many_arguments)]
    fn single_io(
        &self,
        py: Python<'_>,
        which: OpName,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        op: Option<&Bound<'_, PyAny>>,
        async_op: bool,
        hints: Hints,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = which.as_str();
        let opts = c.op_options(name, async_op, hints, timeout)?;
        let native = match c.native() {
            Some(_) => {
                let o = to_tensor(output, &c.tag(name), "output")?;
                let i = to_tensor(input, &c.tag(name), "input")?;
                let rop = op.map(|op| reduce_op_arg(op, &c.tag(name))).transpose()?;
                Some(move |comm: &TorchComm| match (which, rop) {
                    (OpName::ReduceScatterSingle, Some(r)) => {
                        comm.reduce_scatter_single(&o, &i, r, &opts)
                    }
                    (OpName::AllGatherSingle, _) => comm.all_gather_single(&o, &i, &opts),
                    _ => comm.all_to_all_single(&o, &i, &opts),
                })
            }
            None => None,
        };
        c.issue(
            py,
            which,
            |py| {
                let (input, output, a) = (obj(input), obj(output), pybool(py, async_op));
                match which {
                    OpName::ReduceScatterSingle => pre(
                        py,
                        hooks::ReduceScatterSinglePreHookArgs {
                            input,
                            output,
                            async_op: a,
                            red_op: op.map(obj).unwrap_or_else(|| py.None()),
                        },
                    ),
                    OpName::AllGatherSingle => pre(
                        py,
                        hooks::AllGatherSinglePreHookArgs {
                            input,
                            output,
                            async_op: a,
                        },
                    ),
                    _ => pre(
                        py,
                        hooks::AllToAllSinglePreHookArgs {
                            input,
                            output,
                            async_op: a,
                        },
                    ),
                }
            },
            native,
            |py| {
                let mut args = vec![obj(output), obj(input)];
                if let Some(op) = op {
                    args.push(obj(op));
                }
                args.push(pybool(py, async_op));
                tuple(py, args)
            },
            PostKind::Collective,
        )
    }

    /// Issues a batch (see `BatchSendRecv.issue`).
    pub(crate) fn issue_batch(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, Py<PyAny>, i64)>,
        async_op: bool,
        opts: OpOptions,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core;
        let name = "batch_op_issue";
        let native = match c.native() {
            Some(_) => {
                let mut api = Vec::with_capacity(ops.len());
                for (i, (send, t, peer)) in ops.iter().enumerate() {
                    let tensor = to_tensor(t.bind(py), &c.tag(name), &format!("ops[{i}].tensor"))?;
                    let peer = c.rank_arg(name, &format!("ops[{i}].peer"), *peer)?;
                    api.push(if *send {
                        torchcomms::P2POp::Send { tensor, peer }
                    } else {
                        torchcomms::P2POp::Recv { tensor, peer }
                    });
                }
                Some(move |comm: &TorchComm| comm.batch_p2p(&api, &opts))
            }
            None => None,
        };
        let n = ops.len();
        c.issue(
            py,
            OpName::BatchOpIssue,
            |py| {
                pre(
                    py,
                    hooks::BatchOpIssuePreHookArgs {
                        num_ops: n.into_pyobject(py)?.into_any().unbind(),
                        async_op: pybool(py, async_op),
                    },
                )
            },
            native,
            |py| tuple(py, vec![]),
            PostKind::BatchIssue,
        )
    }
}
