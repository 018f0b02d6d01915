//! Mixture-of-experts dispatch and combine on CUDA tensors: the device half of
//! `torchcomms::moe` (whose docs define what dispatch and combine return).
//!
//! Every step is a kernel on the caller's stream; the host never waits for the device. Two
//! transports:
//! - **mapped**: every rank maps every peer's symmetric region (CUDA IPC: NVLink between GPUs,
//!   or the same GPU shared by several ranks). Senders write records straight into the
//!   receiver's region and raise a flag there, and receivers acknowledge each dispatch round so
//!   senders never overwrite unread records. No host involvement: capturable in CUDA graphs.
//! - **staged**: when some pair of ranks cannot map each other (other hosts, or
//!   `CTRAN_BACKENDS` without `nvl`), the kernels pack records locally and the caller moves them
//!   with `device_alltoallv_single` (the GPU progress engine over host transports) between the
//!   send and receive steps ([`DeviceMoe::staged_dispatch`], [`DeviceMoe::staged_combine`]).
//!
//! Rounds are counted on the device, so graph replays advance them too. Errors found on the
//! device (a bad expert id, a peer that never answers, a row that answers no routed slot) land
//! in mapped host memory; [`DeviceMoe::take_error`] turns them into an [`Error`]. A bad expert
//! id is dropped from the routing rather than sent, and every wait gives up at the
//! communicator's timeout, so nothing hangs or writes out of bounds.

pub mod alltoallv;
pub mod kernels;
pub mod layout;
pub mod symmetric;
pub mod words;

use std::sync::Arc;
use std::time::Duration;

use crate::comm::Comm;
use crate::cuda::{Context, DeviceBuffer, Event, RawStream};
use crate::error::{Error, Result};
use crate::gpe::cuda_err;
use kernels::{MoeKernels, MoeParams, Step};
pub use layout::{MoeLayout, MoeShape};
use symmetric::{SymmetricRegion, MAX_RANKS};
pub use words::AbortWord;
use words::{ErrorWords, Slot};

/// The caller's tensors of one exchange (device addresses; 0 where a step does not use one).
#[derive(Debug, Clone, Copy, Default)]
pub struct MoeTensors {
    /// Dispatch: tokens `[tokens, hidden]` bf16.
    pub x: u64,
    /// Dispatch: `[tokens, top_k]` int64 expert ids (-1 unused).
    pub topk_idx: u64,
    /// Dispatch: `[tokens, top_k]` f32 weights.
    pub topk_weights: u64,
    /// Dispatch output: received rows, bf16 (`recv_rows x hidden`).
    pub recv_x: u64,
    /// Dispatch output: received rows, FP8 e4m3 (`recv_rows x hidden` bytes).
    pub recv_x_fp8: u64,
    /// Dispatch output: f32 per received row.
    pub recv_scales: u64,
    /// Dispatch output: f32 per received row.
    pub recv_weights: u64,
    /// Dispatch output: int64 per local expert.
    pub tokens_per_expert: u64,
    /// Combine: expert outputs in the layout dispatch returned, bf16.
    pub expert_out: u64,
    /// Rows of `expert_out`.
    pub expert_rows: usize,
    /// Combine output: `[tokens, hidden]` bf16.
    pub out: u64,
}

/// Buffers the caller hands `device_alltoallv_single` between a staged exchange's steps:
/// `rows` records of `stride` bytes from `send`, into `recv`, with int64 counts per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StagedBuffers {
    /// Packed records to send.
    pub send: u64,
    /// Records `send` holds.
    pub send_rows: usize,
    /// Where received records land, packed by source.
    pub recv: u64,
    /// Records `recv` holds.
    pub recv_rows: usize,
    /// Bytes per record.
    pub stride: usize,
    /// int64 per rank: records sent to it.
    pub send_counts: u64,
    /// int64 per rank: records received from it.
    pub recv_counts: u64,
}

/// The device state of one MoE buffer on one communicator.
#[derive(Debug)]
pub struct DeviceMoe {
    shape: MoeShape,
    layout: MoeLayout,
    kernels: Arc<MoeKernels>,
    /// Peers write it (mapped transport): records, combine rows, flags.
    sym: SymmetricRegion,
    scratch: DeviceBuffer,
    /// Code and three details of the first device error (mapped host memory).
    err: ErrorWords,
    timeout: Duration,
    /// Raised when the communicator aborts.
    abort: Arc<AbortWord>,
    comm: String,
    /// Recorded after the last launch: drop waits for it before freeing memory.
    last: Event,
}

impl DeviceMoe {
    /// Allocates the exchange's memory on `ctx`'s device and, where every pair of ranks can,
    /// maps every peer's region. Every rank of `comm` must call it with the same shape.
    pub fn new(
        comm: &Comm,
        ctx: &Arc<Context>,
        shape: MoeShape,
        abort: Arc<AbortWord>,
    ) -> Result<DeviceMoe> {
        let rank = comm.rank();
        let e = |x| cuda_err("MoeBuffer", rank, x);
        if shape.size > MAX_RANKS {
            return Err(Error::invalid(
                "MoeBuffer: comm",
                format!("at most {MAX_RANKS} ranks on CUDA"),
                shape.size,
            ));
        }
        let (layout, sym_bytes, scratch_bytes) = MoeLayout::new(&shape);
        let scratch = DeviceBuffer::zeroed(ctx, scratch_bytes).map_err(e)?;
        let err = ErrorWords::new(ctx).map_err(e)?;
        let kernels = MoeKernels::get(ctx).map_err(e)?;
        let last = Event::new(ctx).map_err(e)?;
        let sym = SymmetricRegion::new(comm, ctx, sym_bytes, true)?;
        tracing::info!(
            rank,
            transport = if sym.is_mapped() { "mapped" } else { "staged" },
            "MoE buffer ready"
        );
        Ok(DeviceMoe {
            shape,
            layout,
            kernels,
            sym,
            scratch,
            err,
            timeout: comm.config().timeout,
            abort,
            comm: comm.name().to_string(),
            last,
        })
    }

    /// Whether peers write straight into each other's memory (else the caller stages).
    pub fn is_mapped(&self) -> bool {
        self.sym.is_mapped()
    }

    /// The exchange's shape.
    pub fn shape(&self) -> &MoeShape {
        &self.shape
    }

    fn params(&self, tokens: usize, fp8: bool, t: &MoeTensors) -> MoeParams {
        let s = &self.shape;
        MoeParams {
            rank: s.rank as u32,
            size: s.size as u32,
            tokens: tokens as u32,
            hidden: s.hidden as u32,
            top_k: s.top_k as u32,
            local: s.local() as u32,
            max_tokens: s.max_tokens as u32,
            num_experts: s.num_experts as u32,
            fp8: u32::from(fp8),
            mapped: u32::from(self.sym.is_mapped()),
            low_latency: u32::from(s.low_latency),
            y_rows: t.expert_rows as u32,
            rec_stride: s.rec_stride(fp8) as u64,
            crec_stride: s.crec_stride() as u64,
            slab: s.slab() as u64,
            timeout_ns: u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX),
            x: t.x,
            idx: t.topk_idx,
            w: t.topk_weights,
            y: t.expert_out,
            out: t.out,
            recv_x: t.recv_x,
            recv_x_fp8: t.recv_x_fp8,
            recv_scales: t.recv_scales,
            recv_weights: t.recv_weights,
            tokens_per_expert: t.tokens_per_expert,
            scratch: self.scratch.as_ptr(),
            err: self.err.device_ptr(),
            abort: self.abort.device_ptr(),
            at: self.layout,
            peer: self.sym.peers(),
        }
    }

    fn run(&self, steps: &[(Step, usize)], p: &MoeParams, stream: RawStream) -> Result<()> {
        let e = |x| cuda_err("moe", self.shape.rank, x);
        for &(step, grid) in steps {
            let grid = u32::try_from(grid.clamp(1, 65_535)).unwrap_or(65_535);
            // SAFETY: the params address this buffer's regions (alive until `last` completes,
            // which drop waits for), mapped peers' regions (mapped until drop) and the caller's
            // tensors, which the caller keeps alive and sized for the shape (checked by
            // torchcomms::moe before any launch).
            unsafe { self.kernels.launch(step, grid, p, stream) }.map_err(e)?;
        }
        self.last.record(stream).map_err(e)
    }

    /// Blocks for a kernel that walks rows, a warp each.
    fn row_grid(&self) -> usize {
        self.shape.recv_rows().div_ceil(8).min(264)
    }

    /// Dispatch, first half: checks the routing and writes every token's records (to peers,
    /// or packed for [`DeviceMoe::staged_dispatch`]). Few tokens over mapped memory take one
    /// launch: every block routes all of them itself.
    pub fn dispatch_send(
        &self,
        tokens: usize,
        fp8: bool,
        t: &MoeTensors,
        stream: RawStream,
    ) -> Result<()> {
        let p = self.params(tokens, fp8, t);
        if self.sym.is_mapped() && tokens <= kernels::FUSED_MAX_TOKENS {
            return self.run(&[(Step::DispatchFused, tokens)], &p, stream);
        }
        self.run(
            &[(Step::Route, 1), (Step::DispatchSend, tokens.min(1024))],
            &p,
            stream,
        )
    }

    /// Dispatch, second half: waits for every peer's records (mapped) and fills the caller's
    /// received-row tensors and `tokens_per_expert`. Low latency over mapped memory, each
    /// expert's index block copies its own rows (a row's place in its expert's slab needs no
    /// other expert's count), so no copy kernel is launched.
    pub fn dispatch_receive(
        &self,
        tokens: usize,
        fp8: bool,
        t: &MoeTensors,
        stream: RawStream,
    ) -> Result<()> {
        let p = self.params(tokens, fp8, t);
        let index = (Step::DispatchIndex, self.shape.local());
        if self.shape.low_latency && self.sym.is_mapped() {
            return self.run(&[index], &p, stream);
        }
        self.run(&[index, (Step::DispatchCopy, self.row_grid())], &p, stream)
    }

    /// Combine, first half: every received row's expert output goes back to its token's rank.
    pub fn combine_send(&self, tokens: usize, t: &MoeTensors, stream: RawStream) -> Result<()> {
        let p = self.params(tokens, false, t);
        self.run(&[(Step::CombineSend, self.row_grid())], &p, stream)
    }

    /// Combine, second half: waits for every peer's rows (mapped) or places the staged ones,
    /// then writes each token's weighted sum into `out`.
    pub fn combine_receive(&self, tokens: usize, t: &MoeTensors, stream: RawStream) -> Result<()> {
        let p = self.params(tokens, false, t);
        let s = &self.shape;
        let mut steps = Vec::with_capacity(2);
        if !self.sym.is_mapped() {
            steps.push((Step::CombineScatter, (s.max_tokens * s.top_k).min(1024)));
        }
        // Blocks per token: runs of 8 elements, one per thread (moe_combine_reduce).
        let parts = (s.hidden / 8).div_ceil(Step::CombineReduce.block() as usize);
        steps.push((Step::CombineReduce, tokens * parts));
        self.run(&steps, &p, stream)
    }

    /// What a staged dispatch (of FP8 records with `fp8`) moves between
    /// [`DeviceMoe::dispatch_send`] and [`DeviceMoe::dispatch_receive`].
    pub fn staged_dispatch(&self, fp8: bool) -> StagedBuffers {
        let s = &self.shape;
        let at = |off: u64| self.scratch.as_ptr() + off;
        let stride = s.rec_stride(fp8);
        StagedBuffers {
            send: at(self.layout.send),
            send_rows: MoeLayout::send_bytes(s) / stride,
            recv: self.sym.local() + self.layout.drecv,
            recv_rows: s.size * s.max_tokens * s.rec_stride(false) / stride,
            stride,
            send_counts: at(self.layout.send_counts),
            recv_counts: at(self.layout.recv_counts),
        }
    }

    /// What a staged combine moves between [`DeviceMoe::combine_send`] and
    /// [`DeviceMoe::combine_receive`].
    pub fn staged_combine(&self) -> StagedBuffers {
        let s = &self.shape;
        let at = |off: u64| self.scratch.as_ptr() + off;
        let stride = s.crec_stride();
        StagedBuffers {
            send: at(self.layout.send),
            send_rows: MoeLayout::send_bytes(s) / stride,
            recv: at(self.layout.cstage),
            recv_rows: s.max_tokens * s.top_k,
            stride,
            send_counts: at(self.layout.rows_per_src),
            recv_counts: at(self.layout.crecv_counts),
        }
    }

    /// The first error the device reported since the last call, cleared. With `broken_only`,
    /// only an error that broke the exchange (a wait that timed out or saw the abort, a peer's
    /// count beyond the buffer); an error about this rank's own inputs (a dropped expert id, a
    /// combine row without a slot) then stays pending: the exchange completed on every rank,
    /// and refusing this rank's next call for it would leave its peers waiting.
    pub fn take_error(&self, broken_only: bool) -> Option<Error> {
        let d = match broken_only {
            true => self.err.take_slot(Slot::Exchange),
            false => self.err.take(),
        }?;
        let what = |w: u64| {
            [
                "moe",
                "moe_dispatch (the peer's previous records unread)",
                "moe_dispatch",
                "moe_combine",
            ][w.min(3) as usize]
                .to_string()
        };
        if let Some(e) = d.wait_error(what, self.shape.rank, &self.comm, self.timeout) {
            return Some(e);
        }
        let [a, b, c] = d.detail;
        Some(match d.code {
            1 => Error::invalid(
                format!("moe_dispatch: topk_idx[{a}, {b}]"),
                format!(
                    "an expert id in [0, {}) not already chosen for the token, or -1 (the slot was dropped)",
                    self.shape.num_experts
                ),
                c as i64,
            ),
            3 => Error::invalid(
                "moe_combine: handle",
                "rows answering this rank's dispatch, once each",
                format!("from rank {a} a row for token {b} slot {c}"),
            ),
            4 => Error::invalid(
                "moe_combine: handle",
                "an expert output for every routed slot",
                format!("none for token {a} slot {b}"),
            ),
            6 => Error::invalid(
                "moe_combine: expert_out",
                format!("a row for each of the {a} rows dispatch received"),
                format!("{b} rows"),
            ),
            _ => Error::invalid(
                "moe_dispatch",
                format!("at most max_tokens_per_rank ({}) records from a peer", self.shape.max_tokens),
                format!("{b} from rank {a}"),
            ),
        })
    }
}

impl Drop for DeviceMoe {
    fn drop(&mut self) {
        // Kernels on the caller's stream may still use the memory.
        if let Err(e) = self.last.synchronize() {
            tracing::warn!("MoE buffer: waiting for its last kernel: {e}");
        }
    }
}
