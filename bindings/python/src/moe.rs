//! MoE dispatch and combine for Python: `_MoeBuffer` wraps [`torchcomms::moe::MoeBuffer`]
//! (CPU) or [`torchcomms::moe::DeviceMoeBuffer`] (CUDA) over torch tensors that
//! `torchcomms.moe.MoeBuffer` (Python) allocates once and slices into the views it returns.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use torchcomms::moe::{
    DeviceDispatchOutputs, DeviceHandle, DeviceMoeBuffer, DispatchHandle, MoeBuffer, MoeConfig,
    MoeMode,
};
use torchcomms::{DataType, OpOptions};

use crate::comm::PyTorchComm;
use crate::core::{Backend, CommCore};
use crate::error::{guard, not_implemented, value_error, ResultExt};
use crate::tensor::to_tensor;

/// What one dispatch returned that combine needs.
#[pyclass(module = "torchcomms._comms", name = "_MoeHandle", frozen)]
#[derive(Debug)]
pub(crate) struct PyMoeHandle {
    handle: Handle,
}

/// A host dispatch's handle, or a device dispatch's.
#[derive(Debug)]
enum Handle {
    Host(DispatchHandle),
    Device(DeviceHandle),
}

#[pymethods]
impl PyMoeHandle {
    /// Tokens this rank dispatched.
    #[getter]
    fn num_tokens(&self) -> usize {
        match &self.handle {
            Handle::Host(h) => h.num_tokens(),
            Handle::Device(h) => h.num_tokens(),
        }
    }

    /// Per received row (expert-major): (source rank, token on that rank, top-k slot). Only
    /// host dispatches keep them on the host.
    fn row_sources(&self) -> PyResult<Vec<(u32, u32, u32)>> {
        match &self.handle {
            Handle::Host(h) => Ok(h
                .row_sources()
                .iter()
                .map(|s| (s.rank, s.token, s.slot))
                .collect()),
            Handle::Device(_) => Err(value_error(
                "row_sources: a CUDA dispatch keeps where rows came from on the device".to_string(),
            )),
        }
    }
}

/// The buffer of a CPU communicator, or of a CUDA one with its output tensors.
#[derive(Debug)]
enum Inner {
    Host(MoeBuffer),
    Device(DeviceMoeBuffer, Box<DeviceDispatchOutputs>),
}

/// The Rust half of `torchcomms.moe.MoeBuffer`.
#[pyclass(module = "torchcomms._comms", name = "_MoeBuffer", frozen)]
#[derive(Debug)]
pub(crate) struct PyMoeBuffer {
    core: Arc<CommCore>,
    inner: Mutex<Inner>,
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
        py: Python<'_>,
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
        let Backend::Native(c) = &core.backend else {
            return Err(not_implemented(op, &core.name));
        };
        let inner = if c.device() == torchcomms::Device::Cpu {
            Inner::Host(MoeBuffer::with_buffers(c, cfg, tensors).on_rank(core.rank)?)
        } else {
            let n = tensors.len();
            let [recv_x, recv_x_fp8, recv_scales, recv_weights, tokens_per_expert] =
                <[torchcomms::Tensor; 5]>::try_from(tensors).map_err(|_| {
                    value_error(format!(
                        "MoeBuffer: argument `buffers` must be 5 tensors on CUDA (recv_x, recv_x_fp8, recv_scales, recv_weights, tokens_per_expert), got {n}"
                    ))
                })?;
            let outputs = DeviceDispatchOutputs {
                recv_x,
                recv_x_fp8,
                recv_scales,
                recv_weights,
                tokens_per_expert,
            };
            let buffer = py
                .detach(|| DeviceMoeBuffer::new(c, cfg))
                .on_rank(core.rank)?;
            Inner::Device(buffer, Box::new(outputs))
        };
        Ok(PyMoeBuffer {
            core,
            inner: Mutex::new(inner),
        })
    }

    /// Whether peers write into each other's memory directly (CUDA, every rank reachable):
    /// nothing involves the host, so dispatch and combine can be captured in CUDA graphs.
    #[getter]
    fn is_mapped(&self) -> bool {
        match &*self.inner.lock().unwrap_or_else(|p| p.into_inner()) {
            Inner::Host(_) => false,
            Inner::Device(b, _) => b.is_mapped(),
        }
    }

    /// Raises the first error the device reported since the last call (CUDA; the caller
    /// synchronizes the stream first to see the latest).
    fn check(&self) -> PyResult<()> {
        match &*self.inner.lock().unwrap_or_else(|p| p.into_inner()) {
            Inner::Host(_) => Ok(()),
            Inner::Device(b, _) => guard("moe_check", || b.check().on_rank(self.core.rank)),
        }
    }

    /// Dispatches; returns the rows per local expert (host buffers; `None` on CUDA, where the
    /// counts are in the `tokens_per_expert` buffer) and the handle.
    fn dispatch(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        topk_idx: &Bound<'_, PyAny>,
        topk_weights: &Bound<'_, PyAny>,
        use_fp8: bool,
    ) -> PyResult<(Option<Vec<usize>>, PyMoeHandle)> {
        let op = "moe_dispatch";
        let (x, idx, w) = (
            to_tensor(x, op, "x")?,
            to_tensor(topk_idx, op, "topk_idx")?,
            to_tensor(topk_weights, op, "topk_weights")?,
        );
        let Backend::Native(comm) = &self.core.backend else {
            return Err(not_implemented(op, &self.core.name));
        };
        let opts = self.options()?;
        guard(op, || {
            py.detach(|| {
                let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                match &mut *b {
                    Inner::Host(b) => b
                        .dispatch(comm, &x, &idx, &w, use_fp8)
                        .map(|d| (Some(d.tokens_per_expert), Handle::Host(d.handle))),
                    Inner::Device(b, outputs) => b
                        .dispatch(comm, &x, &idx, &w, use_fp8, outputs, &opts)
                        .map(|h| (None, Handle::Device(h))),
                }
            })
            .on_rank(self.core.rank)
            .map(|(counts, handle)| (counts, PyMoeHandle { handle }))
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
        let opts = self.options()?;
        guard(op, || {
            py.detach(|| {
                let mut b = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                match (&mut *b, &handle.handle) {
                    (Inner::Host(b), Handle::Host(h)) => b.combine(comm, &y, h, &o),
                    (Inner::Device(b, _), Handle::Device(h)) => b.combine(comm, &y, h, &o, &opts),
                    _ => Err(torchcomms::Error::invalid(
                        op,
                        "handle",
                        "a handle of this buffer's dispatch",
                        "another buffer's",
                    )),
                }
            })
            .on_rank(self.core.rank)
        })
    }
}

impl PyMoeBuffer {
    /// The caller's stream (CUDA), for the kernels.
    fn options(&self) -> PyResult<OpOptions> {
        let stream = self.core.caller_stream()?;
        Ok(match stream {
            Some(s) => OpOptions::sync().with_stream(s),
            None => OpOptions::sync(),
        })
    }
}
