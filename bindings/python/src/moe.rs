//! MoE dispatch and combine for Python: `_MoeBuffer` wraps [`torchcomms::moe::MoeBuffer`] over
//! torch tensors that `torchcomms.moe.MoeBuffer` (Python) allocates once and slices into the
//! views it returns.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use torchcomms::moe::{DispatchHandle, MoeBuffer, MoeConfig, MoeMode};
use torchcomms::DataType;

use crate::comm::PyTorchComm;
use crate::core::{Backend, CommCore};
use crate::error::{guard, not_implemented, value_error, ResultExt};
use crate::tensor::to_tensor;

/// What one dispatch returned that combine needs.
#[pyclass(module = "torchcomms._comms", name = "_MoeHandle", frozen)]
#[derive(Debug)]
pub(crate) struct PyMoeHandle {
    handle: DispatchHandle,
}

#[pymethods]
impl PyMoeHandle {
    /// Tokens this rank dispatched.
    #[getter]
    fn num_tokens(&self) -> usize {
        self.handle.num_tokens()
    }

    /// Per received row (expert-major): (source rank, token on that rank, top-k slot).
    fn row_sources(&self) -> Vec<(u32, u32, u32)> {
        self.handle
            .row_sources()
            .iter()
            .map(|s| (s.rank, s.token, s.slot))
            .collect()
    }
}

/// The Rust half of `torchcomms.moe.MoeBuffer`.
#[pyclass(module = "torchcomms._comms", name = "_MoeBuffer", frozen)]
#[derive(Debug)]
pub(crate) struct PyMoeBuffer {
    core: Arc<CommCore>,
    inner: Mutex<MoeBuffer>,
}

fn config(
    num_experts: usize,
    hidden: usize,
    max_tokens_per_rank: usize,
    top_k: usize,
    mode: &str,
) -> PyResult<MoeConfig> {
    let mode = MoeMode::from_name(mode).ok_or_else(|| {
        value_error(format!(
            "MoeBuffer: argument `mode` must be 'high_throughput' or 'low_latency', got {mode:?}"
        ))
    })?;
    Ok(MoeConfig {
        num_experts,
        hidden,
        max_tokens_per_rank,
        top_k,
        mode,
    })
}

fn dtype_name(d: DataType) -> &'static str {
    match d {
        DataType::U8 => "uint8",
        DataType::I64 => "int64",
        DataType::BF16 => "bfloat16",
        DataType::F32 => "float32",
        other => unreachable!("MoE buffers are u8, i64, bf16 or f32, not {other}"),
    }
}

#[pymethods]
impl PyMoeBuffer {
    /// The buffers to allocate for `size` ranks: (name, torch dtype name, elements).
    #[staticmethod]
    fn buffer_specs(
        num_experts: usize,
        hidden: usize,
        max_tokens_per_rank: usize,
        top_k: usize,
        mode: &str,
        size: usize,
    ) -> PyResult<Vec<(&'static str, &'static str, usize)>> {
        let cfg = config(num_experts, hidden, max_tokens_per_rank, top_k, mode)?;
        Ok(cfg
            .buffer_specs(size)
            .iter()
            .map(|s| (s.name, dtype_name(s.dtype), s.numel))
            .collect())
    }

    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        comm: &PyTorchComm,
        num_experts: usize,
        hidden: usize,
        max_tokens_per_rank: usize,
        top_k: usize,
        mode: &str,
        buffers: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<PyMoeBuffer> {
        let core = comm.core();
        let op = "MoeBuffer";
        let cfg = config(num_experts, hidden, max_tokens_per_rank, top_k, mode)?;
        let tensors = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| to_tensor(b, op, &format!("buffers[{i}]")))
            .collect::<PyResult<Vec<_>>>()?;
        let inner = match &core.backend {
            Backend::Native(c) => MoeBuffer::with_buffers(c, cfg, tensors).on_rank(core.rank)?,
            Backend::Python(_) => return Err(not_implemented(op, &core.name)),
        };
        Ok(PyMoeBuffer {
            core,
            inner: Mutex::new(inner),
        })
    }

    /// Dispatches; returns the rows per local expert and the handle (rows are in the buffers).
    fn dispatch(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        topk_idx: &Bound<'_, PyAny>,
        topk_weights: &Bound<'_, PyAny>,
        use_fp8: bool,
    ) -> PyResult<(Vec<usize>, PyMoeHandle)> {
        let op = "moe_dispatch";
        let (x, idx, w) = (
            to_tensor(x, op, "x")?,
            to_tensor(topk_idx, op, "topk_idx")?,
            to_tensor(topk_weights, op, "topk_weights")?,
        );
        let Backend::Native(comm) = &self.core.backend else {
            return Err(not_implemented(op, &self.core.name));
        };
        guard(op, || {
            let d = py
                .detach(|| {
                    let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                    b.dispatch(comm, &x, &idx, &w, use_fp8)
                })
                .on_rank(self.core.rank)?;
            Ok((d.tokens_per_expert, PyMoeHandle { handle: d.handle }))
        })
    }

    /// Combines `expert_out` back into `out` (this rank's tokens).
    fn combine(
        &self,
        py: Python<'_>,
        expert_out: &Bound<'_, PyAny>,
        handle: &PyMoeHandle,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let op = "moe_combine";
        let (y, o) = (
            to_tensor(expert_out, op, "expert_out")?,
            to_tensor(out, op, "out")?,
        );
        let Backend::Native(comm) = &self.core.backend else {
            return Err(not_implemented(op, &self.core.name));
        };
        guard(op, || {
            py.detach(|| {
                let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                b.combine(comm, &y, &handle.handle, &o)
            })
            .on_rank(self.core.rank)
        })
    }
}
