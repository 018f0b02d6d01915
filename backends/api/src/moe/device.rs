//! [`DeviceMoeBuffer`]: dispatch and combine on CUDA tensors, with kernels on the caller's
//! stream that the backend provides ([`MoeDeviceEngine`]). The same exchange as
//! [`MoeBuffer`](super::MoeBuffer), bit for bit, but nothing waits on the host: counts and
//! received rows stay on the device. Errors the kernels find surface at
//! [`DeviceMoeBuffer::check`]; those that broke the exchange (a timeout, an abort) also at the
//! next call.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};

use torchcomms_core::{DataType, Device};

use super::{MoeConfig, MoeMode};
use crate::comm::TorchComm;
use crate::error::{Error, Result};
use crate::options::OpOptions;
use crate::tensor::Tensor;

/// The tensors of one device exchange step (device addresses checked by [`DeviceMoeBuffer`];
/// `None` where the step does not use one).
#[derive(Debug, Clone, Default)]
pub struct MoeDeviceTensors {
    /// Dispatch: `[tokens, hidden]` bf16.
    pub x: Option<Tensor>,
    /// Dispatch: `[tokens, top_k]` int64.
    pub topk_idx: Option<Tensor>,
    /// Dispatch: `[tokens, top_k]` f32.
    pub topk_weights: Option<Tensor>,
    /// Dispatch outputs.
    pub outputs: Option<DeviceDispatchOutputs>,
    /// Combine: expert outputs, bf16, in the layout dispatch returned.
    pub expert_out: Option<Tensor>,
    /// Combine output: `[tokens, hidden]` bf16.
    pub out: Option<Tensor>,
    /// Tokens of the dispatch (rows of `x`; for combine, of the handle's dispatch).
    pub tokens: usize,
    /// Dispatch sends FP8.
    pub fp8: bool,
}

/// Where dispatch writes what it received ([`MoeConfig::recv_rows`] rows each).
#[derive(Debug, Clone)]
pub struct DeviceDispatchOutputs {
    /// bf16, `rows * hidden`.
    pub recv_x: Tensor,
    /// FP8 e4m3 as bytes (uint8 or float8_e4m3fn), `rows * hidden`.
    pub recv_x_fp8: Tensor,
    /// f32 per row.
    pub recv_scales: Tensor,
    /// f32 per row.
    pub recv_weights: Tensor,
    /// int64 per local expert.
    pub tokens_per_expert: Tensor,
}

/// The kernels behind a [`DeviceMoeBuffer`], provided by the backend
/// ([`crate::Backend::new_moe`]). Arguments are checked before a call.
pub trait MoeDeviceEngine: Send + Sync + Debug {
    /// Dispatch on `opts.stream`.
    fn dispatch(&self, comm: &TorchComm, t: &MoeDeviceTensors, opts: &OpOptions) -> Result<()>;
    /// Combine on `opts.stream`.
    fn combine(&self, comm: &TorchComm, t: &MoeDeviceTensors, opts: &OpOptions) -> Result<()>;
    /// The first error the kernels reported since the last call, cleared. With `broken_only`,
    /// only one that broke the exchange (a timeout, an abort, a peer beyond the buffer); errors
    /// about this rank's inputs, after which the exchange completed, stay pending.
    fn take_error(&self, broken_only: bool) -> Option<Error>;
    /// Whether peers write into each other's memory directly (no host transport involved,
    /// capturable in CUDA graphs).
    fn is_mapped(&self) -> bool;
}

/// What combine needs of a device dispatch: which dispatch, and its tokens. The routing itself
/// stays in the buffer's device memory, so only the buffer's latest dispatch can be combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceHandle {
    buffer: u64,
    round: u64,
    tokens: usize,
}

impl DeviceHandle {
    /// Tokens this rank dispatched (the rows combine returns).
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }
}

/// Dispatch and combine of CUDA tensors on a CUDA communicator, buffers allocated once.
#[derive(Debug)]
pub struct DeviceMoeBuffer {
    id: u64,
    cfg: MoeConfig,
    device: Device,
    engine: Box<dyn MoeDeviceEngine>,
    /// Dispatches so far.
    round: u64,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The most experts per token on CUDA (the kernels keep a token's slots in shared memory).
const MAX_TOP_K: usize = 256;

impl DeviceMoeBuffer {
    /// A buffer for `comm` (collective: every rank calls it with the same configuration).
    pub fn new(comm: &TorchComm, cfg: MoeConfig) -> Result<DeviceMoeBuffer> {
        const OP: &str = "MoeBuffer";
        let device = comm.device();
        if !matches!(device, Device::Cuda(_)) {
            return Err(Error::invalid(
                OP,
                "comm",
                "a CUDA communicator (cpu ones take MoeBuffer)",
                device,
            ));
        }
        cfg.check(comm.get_size())?;
        if cfg.hidden % 8 != 0 {
            return Err(Error::invalid(
                OP,
                "hidden",
                "a multiple of 8 on CUDA",
                cfg.hidden,
            ));
        }
        if cfg.top_k > MAX_TOP_K {
            return Err(Error::invalid(
                OP,
                "top_k",
                format!("at most {MAX_TOP_K} on CUDA"),
                cfg.top_k,
            ));
        }
        Ok(DeviceMoeBuffer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            engine: comm.backend().new_moe(&cfg)?,
            cfg,
            device,
            round: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// Whether peers write into each other's memory directly (capturable in CUDA graphs).
    pub fn is_mapped(&self) -> bool {
        self.engine.is_mapped()
    }

    /// Raises the first error the kernels reported since the last call.
    pub fn check(&self) -> Result<()> {
        self.engine.take_error(false).map_or(Ok(()), Err)
    }

    /// Raises an error that broke the exchange (a timeout, an abort): a call after one would
    /// wait for peers in a state nobody agrees on. Errors about this rank's own inputs wait
    /// for [`DeviceMoeBuffer::check`]: the exchange completed on every rank, and refusing only
    /// this rank's next call would leave its peers waiting for it.
    fn check_broken(&self) -> Result<()> {
        self.engine.take_error(true).map_or(Ok(()), Err)
    }

    fn tensor(&self, op: &str, arg: &str, t: &Tensor, dtype: DataType, numel: usize) -> Result<()> {
        if t.device() != self.device {
            return Err(Error::invalid(
                op,
                arg,
                format!("a tensor on {}", self.device),
                t.device(),
            ));
        }
        let same = t.dtype() == dtype
            || (dtype == DataType::U8 && t.dtype().size_bytes() == 1)
            || (dtype == DataType::BF16 && t.dtype() == DataType::BF16);
        if !same {
            return Err(Error::invalid(op, arg, format!("dtype {dtype}"), t.dtype()));
        }
        if !t.is_contiguous() || t.numel() != numel || (numel > 0 && t.addr() % 16 != 0) {
            return Err(Error::invalid(
                op,
                arg,
                format!("a contiguous, 16-byte aligned tensor of {numel} elements"),
                format!("{t:?}"),
            ));
        }
        Ok(())
    }

    /// Sends each of this rank's tokens to every rank holding one of its experts, on
    /// `opts.stream`; received rows, scales, weights and counts land in `outputs` (which must
    /// stay alive until the stream has run it). The arguments of [`MoeBuffer::dispatch`](super::MoeBuffer::dispatch),
    /// plus where the rows go and the stream.
    #[allow(clippy::too_many_arguments)]
    pub fn dispatch(
        &mut self,
        comm: &TorchComm,
        x: &Tensor,
        topk_idx: &Tensor,
        topk_weights: &Tensor,
        fp8: bool,
        outputs: &DeviceDispatchOutputs,
        opts: &OpOptions,
    ) -> Result<DeviceHandle> {
        const OP: &str = "moe_dispatch";
        self.check_broken()?;
        let (h, k) = (self.cfg.hidden, self.cfg.top_k);
        let tokens = self.cfg.dispatch_tokens(OP, x)?;
        self.tensor(OP, "x", x, DataType::BF16, tokens * h)?;
        self.tensor(OP, "topk_idx", topk_idx, DataType::I64, tokens * k)?;
        self.tensor(OP, "topk_weights", topk_weights, DataType::F32, tokens * k)?;
        let size = comm.get_size();
        let rows = self.cfg.recv_rows(size);
        let local = self.cfg.local_experts(size);
        self.tensor(OP, "recv_x", &outputs.recv_x, DataType::BF16, rows * h)?;
        self.tensor(
            OP,
            "recv_x_fp8",
            &outputs.recv_x_fp8,
            DataType::U8,
            rows * h,
        )?;
        self.tensor(OP, "recv_scales", &outputs.recv_scales, DataType::F32, rows)?;
        self.tensor(
            OP,
            "recv_weights",
            &outputs.recv_weights,
            DataType::F32,
            rows,
        )?;
        self.tensor(
            OP,
            "tokens_per_expert",
            &outputs.tokens_per_expert,
            DataType::I64,
            local,
        )?;
        let t = MoeDeviceTensors {
            x: Some(x.clone()),
            topk_idx: Some(topk_idx.clone()),
            topk_weights: Some(topk_weights.clone()),
            outputs: Some(outputs.clone()),
            tokens,
            fp8,
            ..MoeDeviceTensors::default()
        };
        self.engine.dispatch(comm, &t, opts)?;
        self.round += 1;
        Ok(DeviceHandle {
            buffer: self.id,
            round: self.round,
            tokens,
        })
    }

    /// Each dispatched token's weighted sum of its experts' rows, into `out` (`[tokens,
    /// hidden]` bf16) on `opts.stream`. `expert_out` has the layout of dispatch's `recv_x`.
    pub fn combine(
        &mut self,
        comm: &TorchComm,
        expert_out: &Tensor,
        handle: &DeviceHandle,
        out: &Tensor,
        opts: &OpOptions,
    ) -> Result<()> {
        const OP: &str = "moe_combine";
        self.check_broken()?;
        if handle.buffer != self.id || handle.round != self.round {
            return Err(Error::invalid(
                OP,
                "handle",
                "the handle of this buffer's latest dispatch",
                if handle.buffer != self.id {
                    "another buffer's"
                } else {
                    "an earlier dispatch's"
                },
            ));
        }
        let h = self.cfg.hidden;
        // Packed rows: as many as the caller computed (the count is on the device; the kernel
        // refuses fewer than arrived). Slabs: all of them.
        let rows = match self.cfg.mode {
            MoeMode::LowLatency => self.cfg.recv_rows(comm.get_size()),
            MoeMode::HighThroughput => expert_out.numel() / h,
        };
        self.tensor(OP, "expert_out", expert_out, DataType::BF16, rows * h)?;
        self.tensor(OP, "out", out, DataType::BF16, handle.tokens * h)?;
        if out.span().overlaps(&expert_out.span()) {
            return Err(Error::invalid(
                OP,
                "out",
                "memory apart from expert_out",
                "overlapping tensors",
            ));
        }
        let t = MoeDeviceTensors {
            expert_out: Some(expert_out.clone()),
            out: Some(out.clone()),
            tokens: handle.tokens,
            ..MoeDeviceTensors::default()
        };
        self.engine.combine(comm, &t, opts)
    }

    /// The layout of received rows.
    pub fn mode(&self) -> MoeMode {
        self.cfg.mode
    }
}
