//! The `ctran` backend's CUDA MoE buffers: the engine's kernels ([`ctran::moe::DeviceMoe`]) on
//! the caller's stream; where peers cannot map each other, `device_alltoallv_single` (the GPU
//! progress engine over host transports) moves the packed records between the kernels.

use std::sync::Arc;

use ctran::cuda::{Context, RawStream};
use ctran::moe::{AbortWord, DeviceMoe, MoeShape, MoeTensors, StagedBuffers};
use ctran::Comm;
use torchcomms::moe::{MoeConfig, MoeDeviceEngine, MoeDeviceTensors, MoeMode};
use torchcomms::{DataType, Device, Error, OpOptions, Result, Tensor, TorchComm};

/// A [`DeviceMoe`] behind the API's [`MoeDeviceEngine`].
#[derive(Debug)]
pub(crate) struct CtranMoe {
    moe: DeviceMoe,
    device: Device,
}

impl CtranMoe {
    pub(crate) fn new(
        comm: &Arc<Comm>,
        ctx: &Arc<Context>,
        ordinal: u32,
        cfg: &MoeConfig,
        abort: Arc<AbortWord>,
    ) -> Result<CtranMoe> {
        let shape = MoeShape {
            rank: comm.rank(),
            size: comm.size(),
            num_experts: cfg.num_experts,
            hidden: cfg.hidden,
            max_tokens: cfg.max_tokens_per_rank,
            top_k: cfg.top_k,
            low_latency: cfg.mode == MoeMode::LowLatency,
        };
        Ok(CtranMoe {
            moe: DeviceMoe::new(comm, ctx, shape, abort)?,
            device: Device::Cuda(ordinal),
        })
    }

    /// Moves a staged step's records with `device_alltoallv_single` on the caller's stream.
    fn stage(&self, comm: &TorchComm, b: StagedBuffers, opts: &OpOptions) -> Result<()> {
        let size = comm.get_size();
        let bytes = |addr: u64, rows: usize| {
            // SAFETY: device memory of the DeviceMoe (alive as long as self, and the operation
            // is ordered before the kernels that follow on the same stream, which drop waits
            // for), `rows * stride` bytes as StagedBuffers says.
            unsafe { Tensor::from_raw(addr as *mut u8, rows * b.stride, DataType::U8, self.device) }
                .with_rows(rows)
        };
        let counts = |addr: u64| {
            // SAFETY: as above; one int64 per rank.
            unsafe { Tensor::from_raw(addr as *mut u8, size, DataType::I64, self.device) }
        };
        let sync = OpOptions {
            async_op: false,
            ..opts.clone()
        };
        comm.device_alltoallv_single(
            &bytes(b.recv, b.recv_rows),
            &bytes(b.send, b.send_rows),
            &counts(b.recv_counts),
            &counts(b.send_counts),
            &sync,
        )
        .map(drop)
    }
}

fn addr(t: &Option<Tensor>) -> u64 {
    t.as_ref().map_or(0, |t| t.addr() as u64)
}

fn device_tensors(t: &MoeDeviceTensors, hidden: usize) -> MoeTensors {
    let o = t.outputs.as_ref();
    let out = |f: fn(&torchcomms::moe::DeviceDispatchOutputs) -> &Tensor| {
        o.map_or(0, |o| f(o).addr() as u64)
    };
    MoeTensors {
        x: addr(&t.x),
        topk_idx: addr(&t.topk_idx),
        topk_weights: addr(&t.topk_weights),
        recv_x: out(|o| &o.recv_x),
        recv_x_fp8: out(|o| &o.recv_x_fp8),
        recv_scales: out(|o| &o.recv_scales),
        recv_weights: out(|o| &o.recv_weights),
        tokens_per_expert: out(|o| &o.tokens_per_expert),
        expert_out: addr(&t.expert_out),
        expert_rows: t.expert_out.as_ref().map_or(0, |y| y.numel() / hidden),
        out: addr(&t.out),
    }
}

impl MoeDeviceEngine for CtranMoe {
    fn dispatch(&self, comm: &TorchComm, t: &MoeDeviceTensors, opts: &OpOptions) -> Result<()> {
        let stream = RawStream(opts.stream.unwrap_or(0));
        let d = device_tensors(t, self.moe.shape().hidden);
        self.moe.dispatch_send(t.tokens, t.fp8, &d, stream)?;
        if !self.moe.is_mapped() {
            self.stage(comm, self.moe.staged_dispatch(t.fp8), opts)?;
        }
        Ok(self.moe.dispatch_receive(t.tokens, t.fp8, &d, stream)?)
    }

    fn combine(&self, comm: &TorchComm, t: &MoeDeviceTensors, opts: &OpOptions) -> Result<()> {
        let stream = RawStream(opts.stream.unwrap_or(0));
        let d = device_tensors(t, self.moe.shape().hidden);
        self.moe.combine_send(t.tokens, &d, stream)?;
        if !self.moe.is_mapped() {
            self.stage(comm, self.moe.staged_combine(), opts)?;
        }
        Ok(self.moe.combine_receive(t.tokens, &d, stream)?)
    }

    fn take_error(&self, broken_only: bool) -> Option<Error> {
        self.moe.take_error(broken_only).map(Error::Engine)
    }

    fn is_mapped(&self) -> bool {
        self.moe.is_mapped()
    }
}
