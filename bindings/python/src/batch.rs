//! `BatchSendRecv` and `P2POp`: point-to-point operations issued together, running
//! concurrently.

use std::collections::HashMap;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyList;
use torchcomms::OpOptions;

use crate::comm::PyTorchComm;
use crate::types::{P2POpType, PyBatchP2POptions};
use crate::work::PyTorchWork;

/// One send or receive of a batch (attributes are read/write).
#[pyclass(module = "torchcomms._comms", name = "P2POp", get_all, set_all)]
#[derive(Debug)]
pub(crate) struct PyP2POp {
    /// SEND or RECV.
    #[pyo3(name = "type")]
    op_type: P2POpType,
    /// The tensor sent or received into.
    tensor: Py<PyAny>,
    /// The peer rank.
    peer: i64,
}

#[pymethods]
impl PyP2POp {
    #[new]
    #[pyo3(signature = (r#type, tensor, peer))]
    fn new(r#type: P2POpType, tensor: Py<PyAny>, peer: i64) -> Self {
        PyP2POp {
            op_type: r#type,
            tensor,
            peer,
        }
    }

    fn __repr__(&self) -> String {
        format!("P2POp({}, peer={})", self.op_type.as_str(), self.peer)
    }
}

/// Collects sends and receives (`send`, `recv`) and issues them together with `issue()`;
/// they run concurrently, unlike separate `send`/`recv` calls.
#[pyclass(module = "torchcomms._comms", name = "BatchSendRecv")]
#[derive(Debug)]
pub(crate) struct PyBatchSendRecv {
    comm: Py<PyTorchComm>,
    ops: Vec<Py<PyP2POp>>,
}

impl PyBatchSendRecv {
    pub(crate) fn new(comm: Py<PyTorchComm>) -> Self {
        PyBatchSendRecv {
            comm,
            ops: Vec::new(),
        }
    }
}

#[pymethods]
impl PyBatchSendRecv {
    /// Queues sending `tensor` to `dst`.
    fn send(&mut self, py: Python<'_>, tensor: Py<PyAny>, dst: i64) -> PyResult<()> {
        self.ops
            .push(Py::new(py, PyP2POp::new(P2POpType::Send, tensor, dst))?);
        Ok(())
    }

    /// Queues receiving into `tensor` from `src`.
    fn recv(&mut self, py: Python<'_>, tensor: Py<PyAny>, src: i64) -> PyResult<()> {
        self.ops
            .push(Py::new(py, PyP2POp::new(P2POpType::Recv, tensor, src))?);
        Ok(())
    }

    /// The queued operations.
    #[getter]
    fn get_ops<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.ops.iter().map(|o| o.clone_ref(py)))
    }

    #[setter]
    fn set_ops(&mut self, ops: Vec<Py<PyP2POp>>) {
        self.ops = ops;
    }

    /// Issues every queued operation; they run concurrently.
    #[pyo3(signature = (async_op, options=None))]
    fn issue(
        &self,
        py: Python<'_>,
        async_op: bool,
        options: Option<PyRef<'_, PyBatchP2POptions>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let (hints, timeout): (HashMap<String, String>, Duration) = match &options {
            Some(o) => (o.hints.clone(), o.timeout),
            None => (HashMap::new(), Duration::ZERO),
        };
        let mut opts = if async_op {
            OpOptions::async_op()
        } else {
            OpOptions::sync()
        };
        // The communicator's hints and default timeout (`set_hints`/`set_timeout`) apply
        // where the batch's options leave them unset.
        let settings = self.comm.get().core.settings();
        let mut all = settings.hints;
        all.extend(hints);
        opts.hints = all.into_iter().collect();
        opts.timeout = Some(
            Some(timeout)
                .filter(|t| !t.is_zero())
                .unwrap_or(settings.timeout),
        );
        let ops = self
            .ops
            .iter()
            .map(|o| {
                let o = o.borrow(py);
                (o.op_type == P2POpType::Send, o.tensor.clone_ref(py), o.peer)
            })
            .collect();
        self.comm.get().issue_batch(py, ops, async_op, opts)
    }
}
