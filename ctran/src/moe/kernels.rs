//! The MoE kernels (`kernels/moe.cu`), compiled by NVRTC at first use and loaded once per
//! device, and their parameter block.

use std::sync::{Arc, OnceLock};

use super::layout::MoeLayout;
use crate::cuda::error::Result;
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{Context, DeviceRepr, Function, Module, RawStream};

use super::symmetric::MAX_RANKS;

/// Source of the kernels: the CUDA/HIP compatibility header, `kernels/report.cuh`, then
/// `kernels/moe.cu`.
pub fn moe_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    crate::cuda::kernels::with_compat(
        &SOURCE,
        &[
            include_str!("kernels/report.cuh"),
            include_str!("kernels/moe.cu"),
        ],
    )
}
/// Its name in logs and cache files.
pub const MOE_SOURCE_NAME: &str = "ctran/src/moe/kernels/moe.cu";

// Fields mirror the CUDA struct of the same name in moe.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MoeParams {
    pub rank: u32,
    pub size: u32,
    pub tokens: u32,
    pub hidden: u32,
    pub top_k: u32,
    pub local: u32,
    pub max_tokens: u32,
    pub num_experts: u32,
    pub fp8: u32,
    pub mapped: u32,
    pub low_latency: u32,
    pub y_rows: u32,
    pub rec_stride: u64,
    pub crec_stride: u64,
    pub slab: u64,
    pub timeout_ns: u64,
    pub x: u64,
    pub idx: u64,
    pub w: u64,
    pub y: u64,
    pub out: u64,
    pub recv_x: u64,
    pub recv_x_fp8: u64,
    pub recv_scales: u64,
    pub recv_weights: u64,
    pub tokens_per_expert: u64,
    pub scratch: u64,
    pub err: u64,
    pub abort: u64,
    pub at: MoeLayout,
    pub peer: [u64; MAX_RANKS],
}

// SAFETY: plain old data laid out as the CUDA struct (repr(C), u32 and u64 fields, no padding
// the kernel would read).
unsafe impl DeviceRepr for MoeParams {}

/// Most tokens the fused dispatch takes: one thread of its block routes each token.
pub const FUSED_MAX_TOKENS: usize = 256;

/// One kernel of the exchange, and the block size it was written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Checks the routing and numbers each token's records (one block).
    Route,
    /// Writes every token's records (a block per token).
    DispatchSend,
    /// Few tokens over mapped memory: routes and writes in one launch (a block per token,
    /// at most [`FUSED_MAX_TOKENS`]).
    DispatchFused,
    /// Lists each local expert's records (a block per local expert); the last block lays out
    /// the rows.
    DispatchIndex,
    /// Copies received rows into the caller's tensors (a warp per row).
    DispatchCopy,
    /// Sends expert outputs back (a warp per row).
    CombineSend,
    /// Staged: checks received combine records and places them (a block per record).
    CombineScatter,
    /// Weighted sums per token (a block per token).
    CombineReduce,
}

impl Step {
    const ALL: [Step; 8] = [
        Step::Route,
        Step::DispatchSend,
        Step::DispatchFused,
        Step::DispatchIndex,
        Step::DispatchCopy,
        Step::CombineSend,
        Step::CombineScatter,
        Step::CombineReduce,
    ];

    fn name(self) -> &'static str {
        match self {
            Step::Route => "moe_route",
            Step::DispatchSend => "moe_dispatch_send",
            Step::DispatchFused => "moe_dispatch_fused",
            Step::DispatchIndex => "moe_dispatch_index",
            Step::DispatchCopy => "moe_dispatch_copy",
            Step::CombineSend => "moe_combine_send",
            Step::CombineScatter => "moe_combine_scatter",
            Step::CombineReduce => "moe_combine_reduce",
        }
    }

    /// Threads per block (the kernels' `__launch_bounds__`).
    pub fn block(self) -> u32 {
        match self {
            Step::Route => 1024,
            _ => 256,
        }
    }
}

/// The MoE kernels loaded on one device.
#[derive(Debug)]
pub struct MoeKernels {
    ctx: Arc<Context>,
    _module: Module,
    functions: Vec<Function>,
}

impl MoeKernels {
    /// The kernels of device `ctx`, compiled (or read from the cache) and loaded at first use.
    pub fn get(ctx: &Arc<Context>) -> Result<Arc<MoeKernels>> {
        static LOADED: PerDevice<MoeKernels> = OnceLock::new();
        load_once(&LOADED, ctx, MOE_SOURCE_NAME, moe_source(), |module, _| {
            let functions = Step::ALL
                .iter()
                .map(|s| module.function(s.name()))
                .collect::<Result<Vec<_>>>()?;
            Ok(MoeKernels {
                ctx: Arc::clone(ctx),
                _module: module,
                functions,
            })
        })
    }

    /// Launches `step` with `grid` blocks on `stream`.
    ///
    /// # Safety
    /// Every address in `params` must be valid for what the kernel does with it (the layout's
    /// regions, the caller's tensors of the sizes the shape implies, mapped peers' regions)
    /// until the kernel has run.
    pub unsafe fn launch(
        &self,
        step: Step,
        grid: u32,
        params: &MoeParams,
        stream: RawStream,
    ) -> Result<()> {
        self.ctx.bind()?;
        let f = self.functions[Step::ALL.iter().position(|s| *s == step).expect("a step")];
        // SAFETY: every kernel takes one MoeParams by value; the caller vouches for its
        // addresses; the module lives as long as self.
        unsafe {
            f.args()
                .arg(params)
                .launch(grid.max(1), step.block(), stream)
        }
    }
}
