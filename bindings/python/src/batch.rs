//! `BatchSendRecv` and `P2POp`: point-to-point operations issued together, running
//! concurrently.

use std::collections::HashMap;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyList;
use torchcomms::OpOptions;

use crate::args::{bool_arg, int_arg, type_name};
use crate::comm::PyTorchComm;
use crate::error::{guard, type_error};
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
    /// The peer rank (an int; checked against the communicator's size at `issue()`).
    peer: Py<PyAny>,
}

impl PyP2POp {
    fn checked(
        op: &str,
        op_type: P2POpType,
        tensor: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
        peer_arg: &str,
    ) -> PyResult<Self> {
        int_arg(peer, op, peer_arg)?;
        Ok(PyP2POp {
            op_type,
            tensor: tensor.clone().unbind(),
            peer: peer.clone().unbind(),
        })
    }
}

#[pymethods]
impl PyP2POp {
    #[new]
    #[pyo3(signature = (r#type, tensor, peer))]
    fn new(
        r#type: &Bound<'_, PyAny>,
        tensor: &Bound<'_, PyAny>,
        peer: &Bound<'_, PyAny>,
    ) -> PyResult<Self> {
        let op_type = r#type.extract::<P2POpType>().map_err(|_| {
            type_error(format!(
                "P2POp: argument `type` must be a P2POpType, got {}",
                type_name(r#type)
            ))
        })?;
        PyP2POp::checked("P2POp", op_type, tensor, peer, "peer")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "P2POp({}, peer={})",
            self.op_type.as_str(),
            self.peer.bind(py)
        )
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
    fn send(&mut self, tensor: &Bound<'_, PyAny>, dst: &Bound<'_, PyAny>) -> PyResult<()> {
        let op = PyP2POp::checked("BatchSendRecv.send", P2POpType::Send, tensor, dst, "dst")?;
        self.ops.push(Py::new(tensor.py(), op)?);
        Ok(())
    }

    /// Queues receiving into `tensor` from `src`.
    fn recv(&mut self, tensor: &Bound<'_, PyAny>, src: &Bound<'_, PyAny>) -> PyResult<()> {
        let op = PyP2POp::checked("BatchSendRecv.recv", P2POpType::Recv, tensor, src, "src")?;
        self.ops.push(Py::new(tensor.py(), op)?);
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
        async_op: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        guard("batch_op_issue", || self.issue_inner(py, async_op, options))
    }
}

impl PyBatchSendRecv {
    fn issue_inner(
        &self,
        py: Python<'_>,
        async_op: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyTorchWork>> {
        let op = "BatchSendRecv.issue";
        let async_op = bool_arg(async_op, op, "async_op")?;
        let options = match options.filter(|o| !o.is_none()) {
            None => None,
            Some(o) => Some(o.cast::<PyBatchP2POptions>().map_err(|_| {
                type_error(format!(
                    "{op}: argument `options` must be a BatchP2POptions or None, got {}",
                    type_name(o)
                ))
            })?),
        };
        let options = options.map(|o| o.borrow());
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
        let settings = self.comm.get().core().settings();
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
                (
                    o.op_type == P2POpType::Send,
                    o.tensor.clone_ref(py),
                    o.peer.clone_ref(py),
                )
            })
            .collect();
        self.comm.get().issue_batch(py, ops, async_op, opts)
    }
}
