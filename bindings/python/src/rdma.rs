//! `torchcomms._transport`: upstream's RDMA transfer API (`RdmaTransport`, `RdmaMemory`, its
//! views and `RdmaRemoteBuffer`) over [`ctran::rdma`]. Tensors are read like every other
//! tensor argument ([`crate::tensor`]); an `RdmaMemory` keeps its tensor alive, and its views
//! keep the `RdmaMemory`, so registered memory outlives every use of it. Transfers release the
//! GIL.

use std::sync::Arc;
use std::time::Duration;

use ctran::rdma::{self, MemDevice, RdmaError};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple, PyType};
use torchcomms::{Device, Tensor};

use crate::error::{guard, timeout_error, value_error};
use crate::tensor::to_tensor;

/// The one mapping of transfer errors: bad input is `ValueError`, a missed deadline
/// `TimeoutError`, everything else `RuntimeError` (all three are `RuntimeError`s).
fn py_err(e: RdmaError) -> PyErr {
    if e.is_invalid_argument() {
        value_error(e.to_string())
    } else if e.is_timeout() {
        timeout_error(e.to_string())
    } else {
        PyRuntimeError::new_err(e.to_string())
    }
}

/// Seconds (a number or a `datetime.timedelta`), `None` for the default.
fn timeout_arg(t: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let Some(t) = t.filter(|t| !t.is_none()) else {
        return Ok(None);
    };
    let secs = match t.extract::<f64>() {
        Ok(s) => s,
        Err(_) => t
            .call_method0("total_seconds")
            .and_then(|s| s.extract::<f64>())
            .map_err(|_| {
                value_error("timeout: expected seconds (a number) or a datetime.timedelta")
            })?,
    };
    if !(secs > 0.0 && secs.is_finite()) {
        return Err(value_error(format!(
            "timeout: expected a positive number of seconds, got {secs}"
        )));
    }
    Ok(Some(Duration::from_secs_f64(secs)))
}

/// Registered memory of one contiguous tensor (upstream's `RdmaMemory`).
#[pyclass(module = "torchcomms._transport", name = "RdmaMemory", frozen)]
pub(crate) struct PyRdmaMemory {
    // Field order: deregistered (waiting for transfers) before the tensor is released.
    mem: Arc<rdma::RdmaMemory>,
    _tensor: Tensor,
}

#[pymethods]
impl PyRdmaMemory {
    #[new]
    fn new(tensor: &Bound<'_, PyAny>) -> PyResult<Self> {
        let t = to_tensor(tensor, "RdmaMemory", "tensor")?;
        if !t.is_contiguous() {
            return Err(value_error(
                "RdmaMemory: argument `tensor` must be contiguous (call .contiguous() first)",
            ));
        }
        let device = match t.device() {
            Device::Cpu => MemDevice::Cpu,
            Device::Cuda(i) => MemDevice::Cuda(i),
        };
        // SAFETY: `[addr, addr + nbytes)` lies inside the tensor's storage (checked by
        // `to_tensor`), and `_tensor` keeps that storage alive until after `mem` is dropped
        // (field order), which waits for every transfer that uses the registration.
        let mem = unsafe { rdma::RdmaMemory::register(t.addr() as u64, t.nbytes() as u64, device) }
            .map_err(py_err)?;
        Ok(PyRdmaMemory { mem, _tensor: t })
    }

    /// A read-only view (the source of a write): `length` bytes at `offset`, default all.
    #[pyo3(signature = (offset=None, length=None))]
    fn to_view(
        slf: &Bound<'_, Self>,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> PyResult<PyRdmaMemoryView> {
        let view = slf.get().mem.to_view(offset, length).map_err(py_err)?;
        Ok(PyRdmaMemoryView {
            view,
            _owner: slf.clone().unbind(),
        })
    }

    /// A writable view (the destination of a read).
    #[pyo3(signature = (offset=None, length=None))]
    fn to_mutable_view(
        slf: &Bound<'_, Self>,
        offset: Option<u64>,
        length: Option<u64>,
    ) -> PyResult<PyRdmaMemoryMutableView> {
        let view = slf
            .get()
            .mem
            .to_mutable_view(offset, length)
            .map_err(py_err)?;
        Ok(PyRdmaMemoryMutableView {
            view,
            _owner: slf.clone().unbind(),
        })
    }

    /// The whole memory as a peer names it.
    fn to_remote_buffer(&self) -> PyRdmaRemoteBuffer {
        PyRdmaRemoteBuffer(self.mem.to_remote_buffer())
    }

    /// Whether this shares the registration of an earlier `RdmaMemory` of the same range.
    fn reused_registration(&self) -> bool {
        self.mem.reused_registration()
    }

    /// Bytes registered.
    fn size(&self) -> u64 {
        self.mem.len()
    }
}

/// A read-only range of an `RdmaMemory`.
#[pyclass(module = "torchcomms._transport", name = "RdmaMemoryView", frozen)]
pub(crate) struct PyRdmaMemoryView {
    view: rdma::RdmaMemoryView,
    _owner: Py<PyRdmaMemory>,
}

#[pymethods]
impl PyRdmaMemoryView {
    /// Bytes in the view.
    fn size(&self) -> u64 {
        self.view.size()
    }
}

/// A writable range of an `RdmaMemory`.
#[pyclass(
    module = "torchcomms._transport",
    name = "RdmaMemoryMutableView",
    frozen
)]
pub(crate) struct PyRdmaMemoryMutableView {
    view: rdma::RdmaMemoryMutableView,
    _owner: Py<PyRdmaMemory>,
}

#[pymethods]
impl PyRdmaMemoryMutableView {
    /// Bytes in the view.
    fn size(&self) -> u64 {
        self.view.size()
    }
}

/// A peer's memory: address, length and access key (picklable).
#[pyclass(module = "torchcomms._transport", name = "RdmaRemoteBuffer", frozen)]
pub(crate) struct PyRdmaRemoteBuffer(rdma::RdmaRemoteBuffer);

#[pymethods]
impl PyRdmaRemoteBuffer {
    #[new]
    fn new(ptr: u64, len: u64, access_key: &str) -> PyResult<Self> {
        rdma::RdmaRemoteBuffer::new(ptr, len, access_key)
            .map(PyRdmaRemoteBuffer)
            .map_err(|e| value_error(format!("RdmaRemoteBuffer: argument `access_key`: {e}")))
    }

    /// Start in the owner's address space.
    #[getter]
    fn ptr(&self) -> u64 {
        self.0.ptr
    }

    /// Bytes.
    #[getter]
    fn len(&self) -> u64 {
        self.0.len
    }

    /// The owner's access key.
    #[getter]
    fn access_key(&self) -> String {
        self.0.access_key()
    }

    fn __getstate__(&self) -> (u64, u64, String) {
        (self.0.ptr, self.0.len, self.0.access_key())
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let ty: Bound<'py, PyType> = slf.get_type();
        let args = slf.get().__getstate__();
        PyTuple::new(
            slf.py(),
            [ty.into_any(), args.into_pyobject(slf.py())?.into_any()],
        )
    }

    fn __reduce_ex__<'py>(slf: &Bound<'py, Self>, _protocol: i64) -> PyResult<Bound<'py, PyTuple>> {
        Self::__reduce__(slf)
    }

    fn __repr__(&self) -> String {
        format!(
            "RdmaRemoteBuffer(ptr={:#x}, len={})",
            self.0.ptr, self.0.len
        )
    }
}

/// Parses the transport's device: `cpu` or an indexed CUDA device.
fn device_arg(dev: &Bound<'_, PyAny>) -> PyResult<MemDevice> {
    let text = dev.str()?.to_string();
    if text == "cpu" {
        return Ok(MemDevice::Cpu);
    }
    if let Some(i) = text
        .strip_prefix("cuda:")
        .and_then(|i| i.parse::<u32>().ok())
    {
        return Ok(MemDevice::Cuda(i));
    }
    Err(value_error(format!(
        "RdmaTransport: argument `device`: expected torch.device(\"cpu\") or an indexed CUDA \
         device such as torch.device(\"cuda:0\"), got {text:?}"
    )))
}

/// One end of a point-to-point connection for one-sided writes and reads.
#[pyclass(module = "torchcomms._transport", name = "RdmaTransport", frozen)]
pub(crate) struct PyRdmaTransport(rdma::RdmaTransport);

#[pymethods]
impl PyRdmaTransport {
    #[new]
    fn new(device: &Bound<'_, PyAny>) -> PyResult<Self> {
        let dev = device_arg(device)?;
        rdma::RdmaTransport::new(dev)
            .map(PyRdmaTransport)
            .map_err(py_err)
    }

    /// True: this software transport works wherever torchcomms does.
    #[staticmethod]
    fn supported() -> bool {
        rdma::RdmaTransport::supported()
    }

    /// Starts listening; returns the URL (bytes) to give the peer out of band.
    fn bind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let url = guard("RdmaTransport.bind", || {
            py.detach(|| self.0.bind()).map_err(py_err)
        })?;
        Ok(PyBytes::new(py, url.as_bytes()))
    }

    /// Connects to the peer whose `bind()` returned `peer_url`; returns 0.
    fn connect(&self, py: Python<'_>, peer_url: &Bound<'_, PyAny>) -> PyResult<i32> {
        let url = match peer_url.extract::<Vec<u8>>() {
            Ok(b) if !peer_url.is_instance_of::<pyo3::types::PyString>() => String::from_utf8(b)
                .map_err(|_| value_error("connect: argument `peer_url`: not UTF-8"))?,
            _ => peer_url.extract::<String>().map_err(|_| {
                value_error("connect: argument `peer_url`: expected the bytes bind() returned")
            })?,
        };
        guard("RdmaTransport.connect", || {
            py.detach(|| self.0.connect(&url)).map_err(py_err)
        })?;
        Ok(0)
    }

    /// Whether the connection is up.
    fn connected(&self) -> bool {
        self.0.connected()
    }

    /// Transfers this side issued, by the path they took (diagnostics and tests; not part of
    /// upstream's API): `cma`, `ipc`, `tcp`, `ib`, `ib_in_place` (of `ib`, moved between
    /// registered memory with no staging copy), `cma_denied`.
    fn _path_stats(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let s = self.0.stats();
        [
            ("cma", s.cma),
            ("ipc", s.ipc),
            ("tcp", s.tcp),
            ("ib", s.ib),
            ("ib_in_place", s.ib_in_place),
            ("cma_denied", s.cma_denied),
        ]
        .into_iter()
        .collect()
    }

    /// Writes `local` into the peer's `remote`; blocks until it landed. Returns 0 (raises on
    /// failure, with the reason).
    #[pyo3(signature = (local, remote, notify=false, timeout=None))]
    fn write(
        &self,
        py: Python<'_>,
        local: PyRef<'_, PyRdmaMemoryView>,
        remote: PyRef<'_, PyRdmaRemoteBuffer>,
        notify: bool,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let timeout = timeout_arg(timeout)?;
        let (view, rb) = (local.view.clone(), remote.0.clone());
        guard("RdmaTransport.write", || {
            py.detach(|| self.0.write(&view, &rb, notify, timeout))
                .map_err(py_err)
        })?;
        Ok(0)
    }

    /// Reads the peer's `remote` into `local`; blocks until it is here. Returns 0.
    #[pyo3(signature = (local, remote, timeout=None))]
    fn read(
        &self,
        py: Python<'_>,
        local: PyRef<'_, PyRdmaMemoryMutableView>,
        remote: PyRef<'_, PyRdmaRemoteBuffer>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<i32> {
        let timeout = timeout_arg(timeout)?;
        let (view, rb) = (local.view.clone(), remote.0.clone());
        guard("RdmaTransport.read", || {
            py.detach(|| self.0.read(&view, &rb, timeout))
                .map_err(py_err)
        })?;
        Ok(0)
    }

    /// Waits until the peer's next write with `notify=True` has landed here.
    #[pyo3(signature = (timeout=None))]
    fn wait_for_write(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let timeout = timeout_arg(timeout)?;
        guard("RdmaTransport.wait_for_write", || {
            py.detach(|| self.0.wait_for_write(timeout)).map_err(py_err)
        })
    }
}

/// Adds the classes to the extension module (`torchcomms._transport` re-exports them).
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRdmaMemory>()?;
    m.add_class::<PyRdmaMemoryView>()?;
    m.add_class::<PyRdmaMemoryMutableView>()?;
    m.add_class::<PyRdmaRemoteBuffer>()?;
    m.add_class::<PyRdmaTransport>()?;
    Ok(())
}
