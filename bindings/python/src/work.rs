//! `TorchWork`: what every operation returns.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;

use crate::core::CommCore;
use crate::error::ResultExt;
use crate::types::WorkStatus;

/// What a work object stands for.
#[derive(Debug)]
pub(crate) enum WorkInner {
    /// An operation of a Rust backend.
    Native(Arc<torchcomms::Work>),
    /// Finished when returned (a Python backend returned None).
    Done,
    /// The object a Python backend returned; `wait()` calls its `wait()`.
    Python {
        obj: Py<PyAny>,
        status: Mutex<WorkStatus>,
    },
}

/// Tracks an operation. `wait()` blocks the calling thread (with the GIL released) until the
/// operation finished on CPU communicators. Dropping a work without waiting is fine: the
/// operation still completes and keeps its tensors alive until then. Waiting twice is fine.
#[pyclass(module = "torchcomms._comms", name = "TorchWork", frozen, weakref)]
#[derive(Debug)]
pub(crate) struct PyTorchWork {
    inner: WorkInner,
    comm: Arc<CommCore>,
    /// `(before, after)` callbacks around `wait()` (our clog hook uses them).
    wait_callbacks: Mutex<Vec<(Py<PyAny>, Py<PyAny>)>>,
}

impl PyTorchWork {
    pub(crate) fn new(inner: WorkInner, comm: Arc<CommCore>) -> Self {
        PyTorchWork {
            inner,
            comm,
            wait_callbacks: Mutex::new(Vec::new()),
        }
    }

    fn callbacks(&self, py: Python<'_>, after: bool) -> Vec<Py<PyAny>> {
        self.wait_callbacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(b, a)| if after { a } else { b }.clone_ref(py))
            .collect()
    }

    /// Waits for the operation: `blocking` blocks the host also on CUDA communicators, where a
    /// plain wait only orders torch's current stream after the operation.
    fn do_wait(&self, py: Python<'_>, blocking: bool) -> PyResult<()> {
        for cb in self.callbacks(py, false) {
            cb.call0(py)?;
        }
        match &self.inner {
            WorkInner::Native(w) => {
                // CUDA: the stream current now waits (it may differ from the issuing one).
                let stream = if blocking {
                    None
                } else {
                    self.comm.caller_stream()?
                };
                let waited = py.detach(|| match stream {
                    Some(s) => w.wait_on_stream(s),
                    None if blocking => w.wait_blocking(),
                    None => w.wait(),
                });
                if let Err(e) = waited {
                    self.comm.on_failure(py, &e);
                    return Err(e).on_rank(self.comm.rank);
                }
            }
            WorkInner::Done => {}
            WorkInner::Python { obj, status } => {
                obj.call_method0(py, "wait")?;
                *status.lock().unwrap_or_else(|p| p.into_inner()) = WorkStatus::Completed;
            }
        }
        for cb in self.callbacks(py, true) {
            cb.call0(py)?;
        }
        Ok(())
    }

    fn completed(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(match &self.inner {
            WorkInner::Native(w) => w.is_completed(),
            WorkInner::Done => true,
            WorkInner::Python { obj, status } => {
                let s = *status.lock().unwrap_or_else(|p| p.into_inner());
                if matches!(
                    s,
                    WorkStatus::Completed | WorkStatus::Error | WorkStatus::TimedOut
                ) {
                    true
                } else if obj.bind(py).hasattr("is_completed")? {
                    obj.call_method0(py, "is_completed")?.extract(py)?
                } else {
                    false
                }
            }
        })
    }
}

#[pymethods]
impl PyTorchWork {
    /// Blocks until the operation finished; raises its error if it failed.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        crate::error::guard("wait", || self.do_wait(py, false))
    }

    /// Blocks the CPU thread until the operation finished (the same as `wait()` on CPU).
    fn wait_blocking(&self, py: Python<'_>) -> PyResult<()> {
        crate::error::guard("wait_blocking", || self.do_wait(py, true))
    }

    /// True once the operation finished, successfully or not.
    fn is_completed(&self, py: Python<'_>) -> PyResult<bool> {
        crate::error::guard("is_completed", || self.completed(py))
    }

    /// Sets the status of a work returned by a Python backend.
    fn _set_status(&self, status: WorkStatus) -> PyResult<()> {
        match &self.inner {
            WorkInner::Python { status: s, .. } => {
                *s.lock().unwrap_or_else(|p| p.into_inner()) = status;
                Ok(())
            }
            _ => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "_set_status is only supported on Python-created work objects",
            )),
        }
    }

    /// The current status (not part of upstream's Python API; used by our hooks and tests).
    fn _status(&self) -> WorkStatus {
        match &self.inner {
            WorkInner::Native(w) => w.status().into(),
            WorkInner::Done => WorkStatus::Completed,
            WorkInner::Python { status, .. } => *status.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Runs `callback(error)` once the operation finished, successfully (`error` is None) or
    /// not (`error` is the exception `wait()` raises): at once on this thread when it already
    /// has, else on the package's completion thread, with the GIL. A work of a Python backend
    /// is waited on here first. Used by the `torch.distributed` backend to complete futures.
    fn _add_done_callback(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        crate::error::guard("_add_done_callback", || match &self.inner {
            WorkInner::Native(w) => {
                if w.is_completed() {
                    let error = crate::completion::outcome(py, w, &self.comm);
                    callback.call1(py, (error,))?;
                } else {
                    crate::completion::add_done_callback(w, &self.comm, callback);
                }
                Ok(())
            }
            WorkInner::Done => callback.call1(py, (py.None(),)).map(drop),
            WorkInner::Python { .. } => {
                let error = match self.do_wait(py, true) {
                    Ok(()) => py.None(),
                    Err(e) => e.into_value(py).into_any(),
                };
                callback.call1(py, (error,)).map(drop)
            }
        })
    }

    /// Registers callables run before and after each `wait()` (used by the clog hook).
    fn _add_wait_callbacks(&self, before: Py<PyAny>, after: Py<PyAny>) {
        self.wait_callbacks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((before, after));
    }

    fn __repr__(&self) -> String {
        format!(
            "TorchWork(comm={:?}, status={})",
            self.comm.name,
            self._status().as_str()
        )
    }
}
