//! `TorchCommWindow`: one-sided puts, signals and waits on a tensor every rank registered
//! (upstream's window API over [`torchcomms::Window`]). The Python object keeps what torch
//! needs to describe the registered tensor (dtype, shape, device) and, when owning, the tensor.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use torchcomms::{WinAccessType, Window};

use crate::core::CommCore;
use pyo3::exceptions::PyRuntimeError;

use crate::error::{guard, ResultExt};
use crate::tensor::to_tensor;
use crate::types::WinAccessType as PyAccess;
use crate::work::{PyTorchWork, WorkInner};

/// The registered tensor as torch describes it.
#[derive(Debug)]
struct Registered {
    /// The tensor itself when the window owns it (`owning=True`).
    tensor: Option<Py<PyAny>>,
    dtype: Py<PyAny>,
    shape: Py<PyAny>,
    device: Py<PyAny>,
}

/// A window of a communicator (upstream's `TorchCommWindow`).
#[pyclass(module = "torchcomms._comms", name = "TorchCommWindow", frozen)]
#[derive(Debug)]
pub(crate) struct PyTorchCommWindow {
    core: Arc<CommCore>,
    win: Arc<Window>,
    registered: Mutex<Option<Registered>>,
}

/// Attributes of a peer's window (upstream's `TorchCommWindowAttr`).
#[pyclass(module = "torchcomms._comms", name = "TorchCommWindowAttr", get_all)]
#[derive(Debug, Clone)]
pub(crate) struct PyWindowAttr {
    /// How the peer's window memory is reached from this rank.
    access_type: PyAccess,
}

#[pymethods]
impl PyWindowAttr {
    #[new]
    fn new() -> Self {
        PyWindowAttr {
            access_type: PyAccess::Separate,
        }
    }
}

/// A local buffer registered for puts from the device API (`register_local_buffer`): this
/// build's transports read local memory directly, so it records the buffer and keeps it alive.
#[pyclass(
    module = "torchcomms._comms",
    name = "RegisteredBuffer",
    frozen,
    get_all
)]
#[derive(Debug)]
pub(crate) struct PyRegisteredBuffer {
    /// Device (or host) address of the buffer.
    ptr: u64,
    /// Its bytes.
    size: u64,
    tensor: Py<PyAny>,
}

impl PyTorchCommWindow {
    pub(crate) fn new(core: Arc<CommCore>, win: Window) -> Self {
        PyTorchCommWindow {
            core,
            win: Arc::new(win),
            registered: Mutex::new(None),
        }
    }

    /// Registers `tensor` with every rank (collective), then records it.
    pub(crate) fn register(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        owning: bool,
    ) -> PyResult<()> {
        let tag = self.core.tag("tensor_register");
        if self
            .registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Err(PyRuntimeError::new_err(format!(
                "{tag}: a tensor is already registered with this window (call \
                 tensor_deregister first)"
            )));
        }
        let t = to_tensor(tensor, &tag, "tensor")?;
        let win = Arc::clone(&self.win);
        py.detach(move || win.tensor_register(&t))
            .on_rank(self.core.rank)?;
        *self.registered.lock().unwrap_or_else(|p| p.into_inner()) = Some(Registered {
            tensor: owning.then(|| tensor.clone().unbind()),
            dtype: tensor.getattr("dtype")?.unbind(),
            shape: tensor.getattr("shape")?.unbind(),
            device: tensor.getattr("device")?.unbind(),
        });
        Ok(())
    }

    fn attr(&self, py: Python<'_>, what: &str) -> PyResult<Py<PyAny>> {
        let reg = self.registered.lock().unwrap_or_else(|p| p.into_inner());
        let r = reg.as_ref().ok_or_else(|| {
            PyRuntimeError::new_err(format!(
                "{}: the window has no registered tensor (call tensor_register first)",
                self.core.tag(what)
            ))
        })?;
        Ok(match what {
            "dtype" => r.dtype.clone_ref(py),
            "shape" => r.shape.clone_ref(py),
            _ => r.device.clone_ref(py),
        })
    }

    fn work(
        &self,
        py: Python<'_>,
        run: impl FnOnce(&Window) -> torchcomms::Result<torchcomms::Work> + Send,
    ) -> PyResult<Py<PyTorchWork>> {
        let win = Arc::clone(&self.win);
        let w = match py.detach(move || run(&win)) {
            Ok(w) => w,
            Err(e) => {
                self.core.on_failure(py, &e);
                return Err(e).on_rank(self.core.rank);
            }
        };
        Py::new(
            py,
            PyTorchWork::new(WorkInner::Native(Arc::new(w)), Arc::clone(&self.core)),
        )
    }
}

#[pymethods]
impl PyTorchCommWindow {
    /// Registers `tensor` (collective: every rank calls it with a tensor of the same size).
    /// `owning=False` keeps no reference: the caller keeps the tensor alive.
    #[pyo3(signature = (tensor, owning=true))]
    fn tensor_register(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        owning: bool,
    ) -> PyResult<()> {
        guard("tensor_register", || self.register(py, tensor, owning))
    }

    /// Deregisters the tensor (collective); puts into the window fail afterwards.
    fn tensor_deregister(&self, py: Python<'_>) -> PyResult<()> {
        guard("tensor_deregister", || {
            let win = Arc::clone(&self.win);
            let r = py.detach(move || win.tensor_deregister());
            *self.registered.lock().unwrap_or_else(|p| p.into_inner()) = None;
            r.on_rank(self.core.rank)
        })
    }

    /// Writes `tensor` into `dst_rank`'s window at element `target_offset_nelems` (one-sided:
    /// the target does not take part). Ordered before this rank's later `signal` to it.
    #[pyo3(signature = (tensor, dst_rank, target_offset_nelems, async_op, hints=None, timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn put(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        dst_rank: &Bound<'_, PyAny>,
        target_offset_nelems: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        guard("put", || {
            let tag = self.core.tag("put");
            let t = to_tensor(tensor, &tag, "tensor")?;
            let dst = self.core.rank_arg("put", "dst_rank", dst_rank)?;
            let offset = crate::args::int_arg(target_offset_nelems, &tag, "target_offset_nelems")?
                .filter(|&o| o >= 0)
                .ok_or_else(|| {
                    crate::error::value_error(format!(
                        "{tag}: invalid argument `target_offset_nelems`: expected a \
                         non-negative element offset, got {target_offset_nelems}"
                    ))
                })? as usize;
            let opts = self.core.op_options("put", async_op, hints, timeout)?;
            self.work(py, move |w| w.put(&t, dst, offset, &opts))
        })
    }

    /// Adds one to the signal `peer_rank` keeps for this rank, after this rank's earlier puts
    /// to it.
    #[pyo3(signature = (peer_rank, async_op, hints=None, timeout=None))]
    fn signal(
        &self,
        py: Python<'_>,
        peer_rank: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        guard("signal", || {
            let peer = self.core.rank_arg("signal", "peer_rank", peer_rank)?;
            let opts = self.core.op_options("signal", async_op, hints, timeout)?;
            self.work(py, move |w| w.signal(peer, &opts))
        })
    }

    /// Waits for the next signal of `peer_rank` (each wait consumes one).
    #[pyo3(signature = (peer_rank, async_op, hints=None, timeout=None))]
    fn wait_signal(
        &self,
        py: Python<'_>,
        peer_rank: &Bound<'_, PyAny>,
        async_op: bool,
        hints: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        guard("wait_signal", || {
            let peer = self.core.rank_arg("wait_signal", "peer_rank", peer_rank)?;
            let opts = self
                .core
                .op_options("wait_signal", async_op, hints, timeout)?;
            self.work(py, move |w| w.wait_signal(peer, &opts))
        })
    }

    /// How `peer_rank`'s window memory is reached: UNIFIED where it is mapped here (this rank;
    /// peers over NVLink), SEPARATE where only puts reach it.
    fn get_attr(&self, peer_rank: &Bound<'_, PyAny>) -> PyResult<PyWindowAttr> {
        guard("get_attr", || {
            let peer = self.core.rank_arg("get_attr", "peer_rank", peer_rank)?;
            let a = self.win.get_attr(peer).on_rank(self.core.rank)?;
            Ok(PyWindowAttr {
                access_type: match a.access_type {
                    WinAccessType::Unified => PyAccess::Unified,
                    WinAccessType::Separate => PyAccess::Separate,
                },
            })
        })
    }

    /// A tensor over `rank`'s window where its memory is mapped here (UNIFIED access): the
    /// registered tensor for this rank, a view of the peer's memory over NVLink.
    fn map_remote_tensor(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        guard("map_remote_tensor", || {
            let q = self.core.rank_arg("map_remote_tensor", "rank", rank)?;
            let mapped = self.win.map_remote(q).on_rank(self.core.rank)?;
            let (dtype, shape, device) = (
                self.attr(py, "dtype")?,
                self.attr(py, "shape")?,
                self.attr(py, "device")?,
            );
            if q == self.core.rank {
                if let Some(t) = self
                    .registered
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .and_then(|r| r.tensor.as_ref().map(|t| t.clone_ref(py)))
                {
                    return Ok(t);
                }
            }
            py.import("torchcomms._window")?
                .call_method1("tensor_at", (mapped, shape, dtype, device))
                .map(Bound::unbind)
        })
    }

    /// Bytes of the registered tensor (0 when none).
    fn get_size(&self) -> usize {
        self.win.get_size()
    }

    /// The registered tensor, or None (none registered, or registered with `owning=False`).
    fn get_tensor(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|r| r.tensor.as_ref().map(|t| t.clone_ref(py)))
    }

    /// Element type of the registered tensor.
    #[getter]
    fn dtype(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.attr(py, "dtype")
    }

    /// Shape of the registered tensor.
    #[getter]
    fn shape(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.attr(py, "shape")
    }

    /// Device of the registered tensor.
    #[getter]
    fn device(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.attr(py, "device")
    }

    /// Registers a local source buffer for puts (upstream's device API). The transports here
    /// read local memory directly, so this checks the tensor and keeps it alive until
    /// `deregister_local_buffer`.
    fn register_local_buffer(&self, tensor: &Bound<'_, PyAny>) -> PyResult<PyRegisteredBuffer> {
        guard("register_local_buffer", || {
            let t = to_tensor(tensor, &self.core.tag("register_local_buffer"), "tensor")?;
            Ok(PyRegisteredBuffer {
                ptr: t.addr() as u64,
                size: t.nbytes() as u64,
                tensor: tensor.clone().unbind(),
            })
        })
    }

    /// Releases a buffer of `register_local_buffer`.
    fn deregister_local_buffer(&self, buffer: &Bound<'_, PyRegisteredBuffer>) -> PyResult<()> {
        let _ = buffer;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!(
            "TorchCommWindow(comm={:?}, size={} bytes)",
            self.core.name,
            self.win.get_size()
        )
    }
}
