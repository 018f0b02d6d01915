//! `TorchComm`: the communicator's accessors, management calls, hooks and batches. Its
//! operations are generated from the table (`ops.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock, Weak};

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use torchcomms::{OpOptions, Reconfigurer, TorchComm};

use crate::args::{callable_arg, hints_arg, index_arg, pre, pybool, str_arg, tuple, type_name};
use crate::core::{Backend, CommCore, NativeComm, PostKind};
use crate::error::{guard, not_implemented, ResultExt};
use crate::hooks::{self, HookKind, HookOwner, RemovableHandle};
use crate::tensor::to_tensor;
use crate::types::{timeout_arg, OpName, PyCommOptions};
use crate::work::{PyTorchWork, WorkInner};

/// A communicator (upstream's `TorchComm`). Create one with `new_comm`; call `finalize()`
/// before dropping it (dropping without `finalize()` does not abort the job).
#[pyclass(module = "torchcomms._comms", name = "TorchComm", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct PyTorchComm {
    /// Replaced by `reconfigure()`; works and windows keep the core they were made on.
    core: RwLock<Arc<CommCore>>,
    /// Set when created with `enable_reconfigure=True`.
    reconfigurer: Option<Reconfigurer>,
}

impl PyTorchComm {
    pub(crate) fn new(core: CommCore, reconfigurer: Option<Reconfigurer>) -> PyTorchComm {
        PyTorchComm {
            core: RwLock::new(Arc::new(core)),
            reconfigurer,
        }
    }

    /// The communicator's current state.
    pub(crate) fn core(&self) -> Arc<CommCore> {
        Arc::clone(&self.core.read().unwrap_or_else(|p| p.into_inner()))
    }
}

#[pymethods]
impl PyTorchComm {
    // ----- accessors -----

    /// This rank.
    fn get_rank(&self) -> usize {
        self.core().rank
    }
    /// Number of ranks.
    fn get_size(&self) -> usize {
        self.core().size
    }
    /// The name given at creation.
    fn get_name(&self) -> String {
        self.core().name.clone()
    }
    /// A copy of the options this communicator was created with.
    fn get_options(&self, py: Python<'_>) -> PyCommOptions {
        let mut o = self.core().options.copy(py);
        let s = self.core().settings();
        o.timeout = s.timeout;
        o.hints = s.hints;
        o
    }
    /// The `torch.device` this communicator serves.
    fn get_device(&self, py: Python<'_>) -> Py<PyAny> {
        self.core().device.clone_ref(py)
    }
    /// The backend name given to `new_comm` (inherited by split children).
    fn get_backend(&self) -> String {
        self.core().backend_name.clone()
    }
    /// Version of the engine behind the backend.
    fn get_backend_version(&self, py: Python<'_>) -> PyResult<String> {
        match &self.core().backend {
            Backend::Native(c) => c.get_backend_version().on_rank(self.core().rank),
            Backend::Python(b) => {
                if b.bind(py).hasattr("get_backend_version")? {
                    b.call_method0(py, "get_backend_version")?.extract(py)
                } else {
                    Err(not_implemented("version", &self.core().name))
                }
            }
        }
    }
    /// The backend object (a Python backend's instance; this communicator for Rust backends).
    fn get_backend_impl(slf: &Bound<'_, Self>) -> Py<PyAny> {
        match &slf.get().core().backend {
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
    /// This process's handle for `reconfigure()` (communicators created with
    /// `enable_reconfigure=True`).
    fn get_init_handle(&self) -> PyResult<String> {
        match &self.reconfigurer {
            Some(r) => Ok(r.init_handle().to_string()),
            None => Err(not_implemented("getInitHandle", &self.core().name)),
        }
    }
    /// Re-forms the communicator from `init_handles` (a collective of the new members, each
    /// passing the same `uuid` and handles): ranks follow the handles' order (a set is sorted).
    /// The returned work is complete.
    #[pyo3(signature = (uuid, init_handles, timeout=None, hints=None))]
    fn reconfigure(
        &self,
        py: Python<'_>,
        uuid: &Bound<'_, PyAny>,
        init_handles: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
        hints: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let op = "reconfigure";
        let old = self.core();
        let tag = old.tag(op);
        let uuid = index_arg(uuid, &tag, "uuid")?;
        hints_arg(hints, &tag)?;
        let handles = crate::reconfigure::handles_arg(init_handles, &tag)?;
        let timeout = timeout_arg(timeout, &tag)?;
        let Some(r) = &self.reconfigurer else {
            // The fake backend reconfigures by doing nothing, as upstream's.
            if old.backend_name == crate::fake::NAME && old.options.enable_reconfigure {
                return Py::new(py, PyTorchWork::new(WorkInner::Done, old));
            }
            return Err(not_implemented(op, &old.name));
        };
        let core = Arc::new(crate::reconfigure::reconfigure(
            py, r, &old, uuid, &handles, timeout,
        )?);
        *self.core.write().unwrap_or_else(|p| p.into_inner()) = Arc::clone(&core);
        Py::new(py, PyTorchWork::new(WorkInner::Done, core))
    }
    /// Sets the default timeout of later operations (those called without `timeout=`).
    fn set_timeout(&self, py: Python<'_>, timeout: &Bound<'_, PyAny>) -> PyResult<()> {
        let t = timeout_arg(Some(timeout), &self.core().tag("set_timeout"))?.ok_or_else(|| {
            crate::error::type_error(format!(
                "{}: argument `timeout` must be a datetime.timedelta, got None",
                self.core().tag("set_timeout")
            ))
        })?;
        if let Backend::Python(b) = &self.core().backend {
            if !b.bind(py).hasattr("set_timeout")? {
                return Err(not_implemented("setTimeout", &self.core().name));
            }
            b.call_method1(py, "set_timeout", (timeout,))?;
        }
        self.core()
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
                self.core().tag("set_hints")
            ))
        })?;
        if let Backend::Python(b) = &self.core().backend {
            if !b.bind(py).hasattr("set_hints")? {
                return Err(not_implemented("setHints", &self.core().name));
            }
            b.call_method1(py, "set_hints", (hints,))?;
        }
        self.core()
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .hints = h;
        Ok(())
    }
    /// Registers a tensor's memory with the backend: CPU tensors need no registration, so this
    /// only checks the tensor.
    fn tensor_register(&self, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.core().native().is_some() {
            to_tensor(tensor, &self.core().tag("tensor_register"), "tensor")?;
        }
        Ok(())
    }
    /// Counterpart of `tensor_register()`.
    fn tensor_deregister(&self, tensor: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.core().native().is_some() {
            to_tensor(tensor, &self.core().tag("tensor_deregister"), "tensor")?;
        }
        Ok(())
    }
    /// Not supported by this build (no memory allocator for CPU communicators).
    fn get_mem_allocator(&self) -> PyResult<()> {
        Err(no_allocator(&self.core().backend_name))
    }
    /// Deprecated alias of `get_mem_allocator()`.
    #[getter(mem_allocator)]
    fn mem_allocator_attr(&self) -> PyResult<()> {
        Err(no_allocator(&self.core().backend_name))
    }
    /// Not supported by this build.
    fn get_device_transport(&self) -> PyResult<()> {
        Err(not_implemented("get_device_transport", &self.core().name))
    }
    /// A one-sided window of this communicator (collective when `tensor` is given: it is
    /// registered at once). CPU tensors go over shared memory or TCP; CUDA tensors over NVLink.
    #[pyo3(signature = (tensor=None))]
    fn new_window(
        &self,
        py: Python<'_>,
        tensor: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<crate::window::PyTorchCommWindow>> {
        guard("new_window", || self.new_window_inner(py, tensor))
    }
    // ----- lifecycle -----

    /// Waits for outstanding work and releases the communicator. Hooks see op id 2**64-1;
    /// no op id is consumed. A second call does nothing.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        guard("finalize", || self.finalize_inner(py))
    }

    /// Fails outstanding and future operations and closes connections; peers see this rank
    /// leave. Runs the abort hooks.
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        guard("abort", || self.abort_inner(py))
    }

    /// Writes this communicator's colltrace (its last operations, sequence numbers and states;
    /// schema `docs/colltrace-schema.md`) as JSON into `dir` (default: the cvar
    /// `TORCHCOMMS_TRACE_DIR`), as `colltrace_rank<N>_<name>_<instance>.json`, and returns the
    /// file's path (the Rust API's `Comm::dump_trace`). `comms-analyzer report DIR` reads the
    /// files of every rank.
    #[pyo3(signature = (dir=None))]
    fn dump_trace(&self, py: Python<'_>, dir: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        let core = &self.core();
        let dir = match dir.filter(|d| !d.is_none()) {
            None => None,
            Some(d) => Some(d.extract::<std::path::PathBuf>().map_err(|_| {
                crate::error::type_error(format!(
                    "{}: argument `dir` must be a str or os.PathLike, got {}",
                    core.tag("dump_trace"),
                    type_name(d)
                ))
            })?),
        };
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
        match &self.core().backend {
            Backend::Native(c) => c.is_abort_supported(),
            Backend::Python(_) => false,
        }
    }

    /// True once aborted.
    fn is_aborted(&self) -> bool {
        match &self.core().backend {
            Backend::Native(c) => c.is_aborted(),
            Backend::Python(_) => self.core().user_aborted.load(Ordering::Acquire),
        }
    }

    /// `cb(name: OpName, op_id: int, args)` runs before each operation, on the calling thread.
    fn register_pre_hook(&self, callback: &Bound<'_, PyAny>) -> PyResult<RemovableHandle> {
        let cb = callable_arg(callback, &self.core().tag("register_pre_hook"), "callback")?;
        Ok(self.register(HookKind::Pre, cb))
    }
    /// `cb(op_id: int, args)` runs when each operation was enqueued (not completed).
    fn register_post_hook(&self, callback: &Bound<'_, PyAny>) -> PyResult<RemovableHandle> {
        let cb = callable_arg(callback, &self.core().tag("register_post_hook"), "callback")?;
        Ok(self.register(HookKind::Post, cb))
    }
    /// `cb()` runs once before the communicator gives up on a timeout or error (and before
    /// the process aborts when `abort_process_on_timeout_or_error` is set).
    fn register_abort_hook(&self, callback: &Bound<'_, PyAny>) -> PyResult<RemovableHandle> {
        let cb = callable_arg(
            callback,
            &self.core().tag("register_abort_hook"),
            "callback",
        )?;
        Ok(self.register(HookKind::Abort, cb))
    }

    // Hooks often close over objects that hold this communicator (a clog keeps its comms):
    // let the garbage collector see through them.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        // Hook lists are only locked briefly by threads that are attached; never block here.
        if let Ok(h) = self.core().hooks.0.try_lock() {
            for cb in h.all() {
                visit.call(cb)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        self.core()
            .hooks
            .0
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
            self.core().name,
            self.core().backend_name,
            self.core().rank,
            self.core().size
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
        name: &Bound<'_, PyAny>,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyTorchComm>>> {
        guard("split", || {
            self.split_inner(py, ranks, name, hints, timeout)
        })
    }

    /// Starts a batch of point-to-point operations that run concurrently.
    fn batch_op_create(slf: &Bound<'_, Self>) -> crate::batch::PyBatchSendRecv {
        crate::batch::PyBatchSendRecv::new(slf.clone().unbind())
    }
}

impl PyTorchComm {
    fn new_window_inner(
        &self,
        py: Python<'_>,
        tensor: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<crate::window::PyTorchCommWindow>> {
        let c = &self.core();
        let tensor = tensor.filter(|t| !t.is_none());
        let native = c
            .native()
            .ok_or_else(|| not_implemented("new_window", &c.name))?;
        let op_id = hooks::next_op_id();
        hooks::run_pre(py, c.as_ref(), OpName::NewWindow, op_id, |py| {
            pre(py, hooks::NewWindowPreHookArgs {})
        })?;
        let made = match py.detach(|| native.new_window(None)) {
            Ok(w) => w,
            Err(e) => {
                c.on_failure(py, &e);
                return Err(e).on_rank(c.rank);
            }
        };
        let win = crate::window::PyTorchCommWindow::new(Arc::clone(c), made);
        if let Some(t) = tensor {
            win.register(py, t, true)?;
        }
        let win = Py::new(py, win)?;
        hooks::run_post(py, c.as_ref(), op_id, |py| {
            pre(py, hooks::NewWindowPostHookArgs {})
        })?;
        Ok(win)
    }

    fn split_inner(
        &self,
        py: Python<'_>,
        ranks: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Option<Py<PyTorchComm>>> {
        let c = &self.core();
        let op = "split";
        let items = if ranks.is_instance_of::<PyList>() || ranks.is_instance_of::<PyTuple>() {
            ranks.try_iter()?.collect::<PyResult<Vec<_>>>()?
        } else {
            return Err(crate::error::type_error(format!(
                "{}: argument `ranks` must be a list of int, got {}",
                c.tag(op),
                type_name(ranks)
            )));
        };
        let mut ranks_u = Vec::with_capacity(items.len());
        for (i, r) in items.iter().enumerate() {
            ranks_u.push(c.rank_arg(op, &format!("ranks[{i}]"), r)?);
        }
        let list: Vec<i64> = ranks_u.iter().map(|&r| r as i64).collect();
        let name = &str_arg(name, &c.tag(op), "name")?;
        let mut child_opts = PyCommOptions::from_env()?;
        if let Some(h) = hints_arg(hints, &c.tag(op))? {
            child_opts.hints = h;
        }
        // Without a timeout of its own the split (and the child) wait as long as this
        // communicator would, not the default.
        child_opts.timeout = match timeout_arg(timeout, &c.tag(op))? {
            Some(t) => t,
            None => c.settings().timeout,
        };
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
                    dedicated_store: false,
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
                        Some(Py::new(py, PyTorchComm::new(core, None))?)
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
            pre(
                py,
                hooks::SplitPostHookArgs {
                    _new_comm: new_comm,
                },
            )
        })?;
        Ok(child)
    }
}

pub(crate) fn no_allocator(backend: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "No allocator factory registered for backend: {backend}"
    ))
}

impl PyTorchComm {
    fn finalize_inner(&self, py: Python<'_>) -> PyResult<()> {
        let core = &self.core();
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

    fn abort_inner(&self, py: Python<'_>) -> PyResult<()> {
        let core = &self.core();
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

    fn register(&self, kind: HookKind, cb: Py<PyAny>) -> RemovableHandle {
        let table = Arc::clone(&self.core().hooks);
        let id = table
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(kind, cb);
        let owner: Arc<dyn HookOwner> = table;
        let weak: Weak<dyn HookOwner> = Arc::downgrade(&owner);
        RemovableHandle::new(weak, id)
    }

    /// Issues a batch (see `BatchSendRecv.issue`).
    pub(crate) fn issue_batch(
        &self,
        py: Python<'_>,
        ops: Vec<(bool, Py<PyAny>, Py<PyAny>)>,
        async_op: bool,
        opts: OpOptions,
    ) -> PyResult<Py<PyTorchWork>> {
        let c = &self.core();
        let name = "batch_op_issue";
        let native = match c.native() {
            Some(_) => {
                let mut api = Vec::with_capacity(ops.len());
                for (i, (send, t, peer)) in ops.iter().enumerate() {
                    let tensor = to_tensor(t.bind(py), &c.tag(name), &format!("ops[{i}].tensor"))?;
                    let peer = c.rank_arg(name, &format!("ops[{i}].peer"), peer.bind(py))?;
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
