//! The state of a Python communicator ([`CommCore`]) and the path every operation takes
//! ([`CommCore::issue`]): the next process-wide op id, the pre-hooks, the backend call with the
//! GIL released, the post-hooks (at enqueue, not completion), then a `TorchWork`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};
use torchcomms::{Error, ErrorKind, OpOptions, TorchComm, Work};

use crate::args::{hints_arg, int_arg};
use crate::error::{not_implemented, value_error, ResultExt};
use crate::hooks::{self, HookOwner, Hooks};
use crate::stream::CurrentStream;
use crate::types::{timeout_arg, OpName, PyCommOptions};
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
    pub(crate) device: Py<PyAny>,
    pub(crate) options: PyCommOptions,
    /// What `set_timeout()`/`set_hints()` changed after creation.
    pub(crate) settings: Mutex<Settings>,
    /// Shared with the communicators that `reconfigure()` makes from this one.
    pub(crate) hooks: Arc<HookTable>,
    pub(crate) abort_hooks_ran: AtomicBool,
    pub(crate) user_aborted: AtomicBool,
    current_stream: CurrentStream,
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
            hooks: Arc::new(HookTable(Mutex::new(Hooks::default()))),
            abort_hooks_ran: AtomicBool::new(false),
            user_aborted: AtomicBool::new(false),
            current_stream: CurrentStream::default(),
        }
    }
}

impl CommCore {
    /// This state, taking over `old`'s hooks and settings (a reconfigured communicator).
    pub(crate) fn continuing(mut self, old: &CommCore) -> CommCore {
        self.hooks = Arc::clone(&old.hooks);
        self.settings = Mutex::new(old.settings());
        self
    }
}

impl HookOwner for CommCore {
    fn hooks(&self) -> &Mutex<Hooks> {
        &self.hooks.0
    }
}

/// A communicator's hooks, which outlive a reconfiguration.
#[derive(Debug)]
pub(crate) struct HookTable(pub(crate) Mutex<Hooks>);

impl HookOwner for HookTable {
    fn hooks(&self) -> &Mutex<Hooks> {
        &self.0
    }
}

/// Which post-hook argument class an operation reports.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PostKind {
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
            Error::Finalized { .. } | Error::Engine(torchcomms_core::Error::Finalized { .. })
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

    pub(crate) fn native(&self) -> Option<&TorchComm> {
        match &self.backend {
            Backend::Native(c) => Some(c),
            Backend::Python(_) => None,
        }
    }

    /// `[rank R] op`: how error messages name the operation.
    pub(crate) fn tag(&self, op: &str) -> String {
        format!("[rank {}] {op}", self.rank)
    }

    /// Reads a rank argument and checks it like upstream: "`root` must be in range [0, N), but
    /// got X" (also for ints beyond 64 bits; anything but an int is a `CommTypeError`).
    pub(crate) fn rank_arg(&self, op: &str, arg: &str, obj: &Bound<'_, PyAny>) -> PyResult<usize> {
        // The common case, without formatting the tag errors need.
        if obj.is_exact_instance_of::<PyInt>() {
            if let Ok(r) = obj.extract::<u32>() {
                if (r as usize) < self.size {
                    return Ok(r as usize);
                }
            }
        }
        let tag = self.tag(op);
        match int_arg(obj, &tag, arg)? {
            Some(r) if r >= 0 && (r as u64) < self.size as u64 => Ok(r as usize),
            _ => Err(value_error(format!(
                "{tag}: invalid argument `{arg}`: {arg} must be in range [0, {}), but got {obj}",
                self.size
            ))),
        }
    }

    /// Whether operations are ordered on CUDA streams (a native CUDA communicator): they have
    /// not finished when issued.
    pub(crate) fn stream_ordered(&self) -> bool {
        self.native()
            .is_some_and(|c| c.device() != torchcomms::Device::Cpu)
    }

    /// On a CUDA communicator, the caller's current stream
    /// (`torch.cuda.current_stream(device).cuda_stream`): operations run after the work issued
    /// on it so far, as with ProcessGroupNCCL. `None` on CPU.
    pub(crate) fn caller_stream(&self) -> PyResult<Option<u64>> {
        Python::attach(|py| self.current_stream.read(py, self.device.bind(py)))
    }

    pub(crate) fn op_options(
        &self,
        op: &str,
        async_op: bool,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<OpOptions> {
        // The tag is formatted only for an argument that is there (the hot path has none).
        let hints = match hints.filter(|h| !h.is_none()) {
            Some(h) => hints_arg(Some(h), &self.tag(op))?,
            None => None,
        };
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
        let own = match timeout.filter(|t| !t.is_none()) {
            Some(t) => timeout_arg(Some(t), &self.tag(op))?,
            None => None,
        };
        o.timeout = Some(own.filter(|t| !t.is_zero()).unwrap_or(settings.timeout));
        o.stream = self.caller_stream()?;
        Ok(o)
    }

    /// The common path of every operation (see the module documentation).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn issue<F>(
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
                    Py::new(py, hooks::CollectivePostHookArgs { _work: w })?.into_any()
                }
                PostKind::BatchIssue => {
                    Py::new(py, hooks::BatchOpIssuePostHookArgs { _work: w })?.into_any()
                }
            })
        })?;
        Ok(work)
    }
}
