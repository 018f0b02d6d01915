//! Mixture-of-experts token exchange: expert-parallel dispatch and combine (in the spirit of
//! DeepEP's `Buffer` and pplx-garden's `AllToAll`).
//!
//! A communicator of `size` ranks holds `num_experts` experts, `num_experts / size` per rank
//! (rank `r` holds experts `r * local .. (r + 1) * local`). Each rank routes its tokens with
//! `topk_idx` (`[tokens, top_k]` int64 expert ids, -1 for an unused slot):
//!
//! - [`MoeBuffer::dispatch`] sends each token once to every rank holding one of its experts and
//!   returns, per local expert, the tokens routed to it (grouped by expert, then by source rank,
//!   then by token), each row with its slot's weight, plus a [`DispatchHandle`].
//! - [`MoeBuffer::combine`] sends each expert's output row back to the token's rank, which
//!   returns `out[t] = bf16(sum over k of topk_weights[t, k] * float(y[t, k]))`, summed in f32 in
//!   slot order (slots with id -1 skipped; a token with none is zeros).
//!
//! Activations are BF16; dispatch can send them as FP8 e4m3fn with one scale per token
//! ([`fp8`]). Everything runs over the communicator's `device_alltoallv_single`, whose row
//! counts travel with the data, so no rank needs another's counts in advance.
//!
//! Buffers are allocated once ([`MoeConfig::buffer_specs`]), for at most
//! `max_tokens_per_rank` tokens per rank; the returned rows are views of them, valid until the
//! next dispatch. Two layouts of the received rows: high-throughput packs them (`[rows,
//! hidden]`, expert `e`'s rows after those of experts `< e`); low-latency gives each local
//! expert a fixed slab of `size * max_tokens_per_rank` rows (`[local, slab, hidden]`), the shape
//! decoding kernels write into directly.
//!
//! [`MoeBuffer`] packs and unpacks on the host: CPU communicators and tensors.
//! [`DeviceMoeBuffer`] does the same exchange with kernels on the caller's stream for CUDA
//! communicators (the backend provides them: [`MoeDeviceEngine`]); its counts and received rows
//! stay on the device.

mod buffer;
mod device;
pub mod fp8;
mod route;

pub use buffer::MoeBuffer;
pub use device::{
    DeviceDispatchOutputs, DeviceHandle, DeviceMoeBuffer, MoeDeviceEngine, MoeDeviceTensors,
};
pub use route::RowSource;

use torchcomms_core::DataType;

/// How received rows are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeMode {
    /// Packed by expert: `[rows, hidden]`.
    HighThroughput,
    /// A fixed slab per local expert: `[local experts, size * max_tokens_per_rank, hidden]`.
    LowLatency,
}

impl MoeMode {
    /// The mode named `name` (`high_throughput` or `low_latency`).
    pub fn from_name(name: &str) -> Option<MoeMode> {
        match name {
            "high_throughput" | "ht" | "normal" => Some(MoeMode::HighThroughput),
            "low_latency" | "ll" => Some(MoeMode::LowLatency),
            _ => None,
        }
    }
}

/// The shape of one expert-parallel exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts over all ranks (a multiple of the communicator's size).
    pub num_experts: usize,
    /// Elements per token.
    pub hidden: usize,
    /// The most tokens a rank dispatches at once.
    pub max_tokens_per_rank: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Layout of received rows.
    pub mode: MoeMode,
}

/// One buffer [`MoeBuffer`] needs: its role, element type and element count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSpec {
    /// Which buffer (see [`MoeConfig::buffer_specs`]).
    pub name: &'static str,
    /// Element type.
    pub dtype: DataType,
    /// Elements.
    pub numel: usize,
}

impl MoeConfig {
    /// Checks the configuration for a communicator of `size` ranks.
    pub fn check(&self, size: usize) -> crate::error::Result<()> {
        use crate::error::Error;
        const OP: &str = "MoeBuffer";
        if self.num_experts == 0 || self.num_experts % size != 0 {
            return Err(Error::invalid(
                OP,
                "num_experts",
                format!("a positive multiple of the communicator's size {size}"),
                self.num_experts,
            ));
        }
        for (arg, v) in [
            ("hidden", self.hidden),
            ("max_tokens_per_rank", self.max_tokens_per_rank),
            ("top_k", self.top_k),
        ] {
            if v == 0 {
                return Err(Error::invalid(OP, arg, "at least 1", v));
            }
        }
        if self.top_k > self.num_experts {
            return Err(Error::invalid(
                OP,
                "top_k",
                format!("at most num_experts ({})", self.num_experts),
                self.top_k,
            ));
        }
        Ok(())
    }

    /// The tokens of dispatch's `x` of operation `op`: `[tokens, hidden]`, at most
    /// `max_tokens_per_rank` of them.
    pub(crate) fn dispatch_tokens(
        &self,
        op: &str,
        x: &crate::tensor::Tensor,
    ) -> crate::error::Result<usize> {
        use crate::error::Error;
        let (tokens, hidden) = (x.rows(), self.hidden);
        if x.numel() != tokens * hidden {
            return Err(Error::invalid(
                op,
                "x",
                format!("[tokens, {hidden}] (hidden)"),
                format!("{x:?} with {tokens} rows"),
            ));
        }
        if tokens > self.max_tokens_per_rank {
            return Err(Error::invalid(
                op,
                "x",
                format!(
                    "at most max_tokens_per_rank ({}) tokens",
                    self.max_tokens_per_rank
                ),
                tokens,
            ));
        }
        Ok(tokens)
    }

    /// Experts per rank.
    pub fn local_experts(&self, size: usize) -> usize {
        self.num_experts / size.max(1)
    }

    /// Rows of a low-latency expert slab: every rank's every token.
    pub fn slab_rows(&self, size: usize) -> usize {
        size * self.max_tokens_per_rank
    }

    /// Rows the received-token buffers hold.
    pub fn recv_rows(&self, size: usize) -> usize {
        let local = self.local_experts(size);
        match self.mode {
            MoeMode::HighThroughput => self.slab_rows(size) * self.top_k.min(local),
            MoeMode::LowLatency => local * self.slab_rows(size),
        }
    }

    /// The buffers of a [`MoeBuffer`] on `size` ranks: `send` and `recv` (bytes dispatch and
    /// combine move), `send_counts` and `recv_counts` (int64 per rank), `recv_x` (BF16 rows),
    /// `recv_x_fp8` (FP8 rows as bytes), `recv_scales` and `recv_weights` (f32 per row).
    pub fn buffer_specs(&self, size: usize) -> Vec<BufferSpec> {
        let dispatch = route::DispatchRecord::new(self.hidden, true, self.top_k)
            .bytes()
            .max(route::DispatchRecord::new(self.hidden, false, self.top_k).bytes());
        let combine = route::combine_record_bytes(self.hidden);
        let t = self.max_tokens_per_rank;
        let rows = self.recv_rows(size);
        let send = (t * self.top_k.min(size) * dispatch).max(rows * combine);
        let recv = (size * t * dispatch).max(t * self.top_k * combine);
        let spec = |name, dtype, numel| BufferSpec { name, dtype, numel };
        vec![
            spec("send", DataType::U8, send),
            spec("recv", DataType::U8, recv),
            spec("send_counts", DataType::I64, size),
            spec("recv_counts", DataType::I64, size),
            spec("recv_x", DataType::BF16, rows * self.hidden),
            spec("recv_x_fp8", DataType::U8, rows * self.hidden),
            spec("recv_scales", DataType::F32, rows),
            spec("recv_weights", DataType::F32, rows),
        ]
    }
}

/// What a dispatch returns besides the rows (which are in the buffer's `recv_x`, or
/// `recv_x_fp8` and `recv_scales`, and `recv_weights`).
#[derive(Debug, Clone)]
pub struct Dispatched {
    /// Rows per local expert.
    pub tokens_per_expert: Vec<usize>,
    /// Whether the rows are FP8 (in `recv_x_fp8`, scales in `recv_scales`).
    pub fp8: bool,
    /// What combine needs.
    pub handle: DispatchHandle,
}

impl Dispatched {
    /// Rows received in all.
    pub fn rows(&self) -> usize {
        self.tokens_per_expert.iter().sum()
    }
}

/// What [`MoeBuffer::combine`] needs of a dispatch: where each received row came from, and this
/// rank's routing.
#[derive(Debug, Clone)]
pub struct DispatchHandle {
    pub(crate) buffer: u64,
    /// Received rows in expert-major order, with their origin.
    pub(crate) rows: Vec<RowSource>,
    pub(crate) tokens_per_expert: Vec<usize>,
    /// This rank's tokens.
    pub(crate) tokens: usize,
    /// This rank's `topk_idx` and `topk_weights`, row-major.
    pub(crate) topk_idx: Vec<i64>,
    pub(crate) topk_weights: Vec<f32>,
}

impl DispatchHandle {
    /// Tokens this rank dispatched (the rows combine returns).
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }

    /// Where each received row came from, in expert-major order.
    pub fn row_sources(&self) -> &[RowSource] {
        &self.rows
    }
}
