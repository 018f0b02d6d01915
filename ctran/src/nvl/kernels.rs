//! The NVLink transport's kernels (`kernels/nvl.cu`): one collective kernel per element type and
//! one point-to-point kernel, with the parameter blocks they take by value. The layouts here
//! mirror the CUDA structs field for field (`#[repr(C)]`, checked by size in a test).

use std::sync::{Arc, OnceLock};

use crate::cuda::error::{CudaError, Result};
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{Context, DeviceRepr, Function, Module, RawStream};
use crate::DataType;

/// Source of the NVLink kernels: the CUDA/HIP compatibility header, the project's common
/// helpers, then `kernels/nvl.cu`.
pub fn nvl_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    crate::cuda::kernels::with_compat(
        &SOURCE,
        &[
            crate::cuda::kernels::COMMON_CUH,
            include_str!("kernels/nvl.cu"),
        ],
    )
}
/// Its name in logs and cache files.
pub const NVL_SOURCE_NAME: &str = "ctran/src/nvl/kernels/nvl.cu";

/// Most ranks one kernel addresses (peers of one NVLink domain).
pub const MAX_RANKS: usize = 8;
/// Most copy segments of one collective launch, before and after the barrier each.
pub const MAX_SEGS: usize = 16;
/// Most transfers of one point-to-point launch.
pub const MAX_P2P: usize = 32;
/// Most blocks of a grid (the flag arrays are sized for it).
pub const MAX_BLOCKS: usize = 256;
/// Threads per block.
pub const THREADS: u32 = 512;

/// Bytes of the flag array every rank exports (five regions of `MAX_RANKS x MAX_BLOCKS` words:
/// two collective barriers, sends, receives, and the pipeline's few words per peer).
pub const FLAG_BYTES: usize = 5 * MAX_RANKS * MAX_BLOCKS * 8;
/// Bytes of the local counter array (two collective rows, send and receive per peer, then the
/// pipeline's base).
pub const COUNTER_BYTES: usize = (3 + 2 * MAX_RANKS) * MAX_BLOCKS * 8;
/// Threads of the pipeline's sync kernel (one per rank at most).
pub const SYNC_THREADS: u32 = 32;

/// Status word values a kernel writes when it gives up.
pub const STATUS_TIMEOUT: u32 = 1;
/// Status word value after the host's abort flag was seen.
pub const STATUS_ABORTED: u32 = 2;

/// One copy: `len` bytes from `src` to `dst`; an `*_arena` flag adds the current arena half.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Seg {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub src_arena: u32,
    pub dst_arena: u32,
}

/// Where a kernel's flags, counters and status live.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Sync {
    pub flags: u64,
    pub peer_flags: [u64; MAX_RANKS],
    pub counters: u64,
    pub status: u64,
    pub abort_flag: u64,
    pub timeout_ns: u64,
    pub rank: u32,
    pub nranks: u32,
}

/// Reduction operator codes of the kernels.
#[allow(missing_docs)]
pub mod op_code {
    pub const SUM: u32 = 0;
    pub const PROD: u32 = 1;
    pub const MIN: u32 = 2;
    pub const MAX: u32 = 3;
    pub const BAND: u32 = 4;
    pub const BOR: u32 = 5;
    pub const BXOR: u32 = 6;
    pub const AVG: u32 = 7;
    pub const PREMUL: u32 = 8;
}

/// The collective kernel's parameters.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CollParams {
    pub sync: Sync,
    pub half_bytes: u64,
    pub rcount: u64,
    pub factor: f64,
    pub divisor: i64,
    pub rsrc: [u64; MAX_RANKS],
    pub rdst: [u64; MAX_RANKS],
    pub rsrc_arena: u32,
    pub rdst_arena: u32,
    pub nsrc: u32,
    pub ndst: u32,
    pub op: u32,
    pub npre: u32,
    pub ncopy: u32,
    pub end_barrier: u32,
    pub pre: [Seg; MAX_SEGS],
    pub copy: [Seg; MAX_SEGS],
}

impl CollParams {
    /// No data moved: a barrier.
    pub fn new(sync: Sync) -> CollParams {
        CollParams {
            sync,
            half_bytes: 0,
            rcount: 0,
            factor: 1.0,
            divisor: 1,
            rsrc: [0; MAX_RANKS],
            rdst: [0; MAX_RANKS],
            rsrc_arena: 0,
            rdst_arena: 0,
            nsrc: 0,
            ndst: 0,
            op: 0,
            npre: 0,
            ncopy: 0,
            end_barrier: 0,
            pre: [Seg::default(); MAX_SEGS],
            copy: [Seg::default(); MAX_SEGS],
        }
    }
}

/// The low-latency all_reduce's parameters (`tc_nvl_ll_<type>`).
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LlParams {
    pub sync: Sync,
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
    pub area: u64,
    pub peer_area: [u64; MAX_RANKS],
    pub half_bytes: u64,
    pub slot_bytes: u64,
    pub factor: f64,
    pub divisor: i64,
    pub op: u32,
    pub pad: u32,
}

/// Bytes of one low-latency line: 8 data bytes and their flag twice.
pub const LL_LINE_BYTES: u64 = 16;
/// Data bytes one low-latency line carries.
pub const LL_DATA_BYTES: u64 = 8;

/// Which word of the pipeline's flags a sync raises or awaits (`kernels/nvl.cu`, `F_PIPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeFlag {
    /// Every rank has reached the operation's start (or end).
    Barrier = 0,
    /// A chunk has arrived in its owner's scratch.
    Arrived = 1,
    /// The owner has reduced a chunk, so its scratch slot may be written again.
    Free = 2,
}

/// No flag: a sync that only signals, or only waits.
const PIPE_NONE: u32 = 3;

/// The pipeline's sync kernel parameters.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PipeSync {
    pub sync: Sync,
    pub signal_value: u64,
    pub wait_value: u64,
    pub advance: u64,
    pub signal_kind: u32,
    pub wait_kind: u32,
}

impl PipeSync {
    /// Raises `signal` in every peer, then waits for `wait` from every peer (values relative to
    /// the comm's pipeline base), then advances the base by `advance`.
    pub fn new(
        sync: Sync,
        signal: Option<(PipeFlag, u64)>,
        wait: Option<(PipeFlag, u64)>,
        advance: u64,
    ) -> PipeSync {
        let kind = |f: Option<(PipeFlag, u64)>| f.map_or((PIPE_NONE, 0), |(k, v)| (k as u32, v));
        let (signal_kind, signal_value) = kind(signal);
        let (wait_kind, wait_value) = kind(wait);
        PipeSync {
            sync,
            signal_value,
            wait_value,
            advance,
            signal_kind,
            wait_kind,
        }
    }
}

/// One transfer of the point-to-point kernel.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct P2pOp {
    pub buf: u64,
    pub len: u64,
    pub peer: u32,
    pub is_send: u32,
}

/// The point-to-point kernel's parameters.
// Fields mirror the CUDA struct of the same name in nvl.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct P2pParams {
    pub sync: Sync,
    pub ring: u64,
    pub peer_ring: [u64; MAX_RANKS],
    pub slot_bytes: u64,
    pub slots: u32,
    pub nops: u32,
    pub ops: [P2pOp; MAX_P2P],
}

// SAFETY: each is a `#[repr(C)]` `Copy` struct of plain integers mirroring the CUDA struct
// the kernel takes by value (sizes pinned by a test), so its bytes are a valid kernel argument.
unsafe impl DeviceRepr for CollParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for LlParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for PipeSync {}
// SAFETY: as above.
unsafe impl DeviceRepr for P2pParams {}

/// The NVLink kernels loaded on one device.
#[derive(Debug)]
pub struct NvlKernels {
    ctx: Arc<Context>,
    _module: Module,
    /// Collective kernel per element type, in [`DataType::ALL`] order.
    coll: Vec<(DataType, Function)>,
    /// The pipeline's local reduction per element type, in the same order.
    pipe_reduce: Vec<(DataType, Function)>,
    /// The low-latency all_reduce per element type, in the same order.
    ll: Vec<(DataType, Function)>,
    p2p: Function,
    pipe_sync: Function,
}

fn kernel_suffix(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F32 => "f32",
        DataType::F64 => "f64",
        DataType::F16 => "f16",
        DataType::BF16 => "bf16",
        DataType::I8 => "i8",
        DataType::U8 => "u8",
        DataType::I32 => "i32",
        DataType::I64 => "i64",
        DataType::Bool => "bool",
    }
}

impl NvlKernels {
    /// The kernels of device `ctx`, compiled (or read from the cache) and loaded at first use.
    pub fn get(ctx: &Arc<Context>) -> Result<Arc<NvlKernels>> {
        static LOADED: PerDevice<NvlKernels> = OnceLock::new();
        load_once(&LOADED, ctx, NVL_SOURCE_NAME, nvl_source(), |module, _| {
            let mut coll = Vec::new();
            let mut pipe_reduce = Vec::new();
            let mut ll = Vec::new();
            for d in DataType::ALL {
                let name = format!("tc_nvl_coll_{}", kernel_suffix(d));
                coll.push((d, module.function(&name)?));
                let name = format!("tc_nvl_pipe_reduce_{}", kernel_suffix(d));
                pipe_reduce.push((d, module.function(&name)?));
                let name = format!("tc_nvl_ll_{}", kernel_suffix(d));
                ll.push((d, module.function(&name)?));
            }
            Ok(NvlKernels {
                ctx: Arc::clone(ctx),
                p2p: module.function("tc_nvl_p2p")?,
                pipe_sync: module.function("tc_nvl_pipe_sync")?,
                coll,
                pipe_reduce,
                ll,
                _module: module,
            })
        })
    }

    /// Launches the collective kernel for `dtype` (`Bool`'s for copies only) on `stream`.
    ///
    /// # Safety
    /// Every address in `p` must be valid device memory (or mapped peer memory) of the kind
    /// the kernel reads or writes there until it finishes, and every rank of the comm must
    /// launch the matching kernel with the same grid, or the barriers wait until the timeout.
    pub unsafe fn coll(
        &self,
        dtype: DataType,
        grid: u32,
        p: &CollParams,
        stream: RawStream,
    ) -> Result<()> {
        let f = by_dtype(&self.coll, dtype, "tc_nvl_coll")?;
        // SAFETY: the kernel takes one CollParams; the caller vouches for the addresses inside.
        unsafe { self.launch_with(f, grid, THREADS, p, stream) }
    }

    /// Launches the low-latency all_reduce for `dtype` on `grid` blocks.
    ///
    /// # Safety
    /// `p.src` and `p.dst` must be device memory valid for `p.bytes` until the kernel
    /// finishes, the LL regions those of this comm's ranks, and every rank must launch it with
    /// the same grid and size, or it waits until the timeout.
    pub unsafe fn ll(
        &self,
        dtype: DataType,
        grid: u32,
        p: &LlParams,
        stream: RawStream,
    ) -> Result<()> {
        let f = by_dtype(&self.ll, dtype, "tc_nvl_ll")?;
        // SAFETY: the kernel takes one LlParams; the caller vouches for the addresses inside.
        unsafe { self.launch_with(f, grid, THREADS, p, stream) }
    }

    /// Launches the pipeline's local reduction for `dtype`: `p.rcount` elements of
    /// `p.rsrc[..p.nsrc]` reduced into `p.rdst[..p.ndst]`; nothing else of `p` but the
    /// operator fields is read.
    ///
    /// # Safety
    /// Every source and destination must be device memory of this context, valid for
    /// `p.rcount` elements until the kernel finishes.
    pub unsafe fn pipe_reduce(
        &self,
        dtype: DataType,
        grid: u32,
        p: &CollParams,
        stream: RawStream,
    ) -> Result<()> {
        let f = by_dtype(&self.pipe_reduce, dtype, "tc_nvl_pipe_reduce")?;
        // SAFETY: the kernel takes one CollParams; the caller vouches for the addresses inside.
        unsafe { self.launch_with(f, grid, THREADS, p, stream) }
    }

    /// Launches the pipeline's sync kernel (one warp) on `stream`.
    ///
    /// # Safety
    /// `p.sync` must describe this comm's flags, counters and status (alive until the kernel
    /// finishes), and every peer must raise the flags this waits for, or it waits until the
    /// timeout.
    pub unsafe fn pipe_sync(&self, p: &PipeSync, stream: RawStream) -> Result<()> {
        // SAFETY: the kernel takes one PipeSync; the caller vouches for the addresses.
        unsafe { self.launch_with(self.pipe_sync, 1, SYNC_THREADS, p, stream) }
    }

    /// Launches the point-to-point kernel on `stream`.
    ///
    /// # Safety
    /// As for [`NvlKernels::coll`]; the matching peers must launch their halves.
    pub unsafe fn p2p(&self, grid: u32, p: &P2pParams, stream: RawStream) -> Result<()> {
        // SAFETY: the kernel takes one P2pParams; the caller vouches for the addresses.
        unsafe { self.launch_with(self.p2p, grid, THREADS, p, stream) }
    }

    /// Launches `f`, whose one parameter is a `P` passed by value (copied at launch).
    ///
    /// # Safety
    /// `f` must take exactly one parameter with `P`'s layout, and the addresses in `p` must be
    /// valid as that kernel uses them until it finishes.
    unsafe fn launch_with<P: DeviceRepr>(
        &self,
        f: Function,
        grid: u32,
        threads: u32,
        p: &P,
        stream: RawStream,
    ) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: forwarded to the caller; the launch copies `p`.
        unsafe { f.args().arg(p).launch(grid, threads, stream) }
    }
}

/// The kernel of `list` for `dtype`.
fn by_dtype(list: &[(DataType, Function)], dtype: DataType, name: &str) -> Result<Function> {
    list.iter()
        .find(|(d, _)| *d == dtype)
        .map(|(_, f)| *f)
        .ok_or_else(|| CudaError::NoKernel {
            name: name.into(),
            dtype: dtype.name().into(),
            op: "nvl".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_have_the_cuda_layout() {
        // Sizes computed from nvl.cu's structs (8-byte aligned, no padding but at the ends).
        assert_eq!(std::mem::size_of::<Seg>(), 32);
        assert_eq!(std::mem::size_of::<Sync>(), 8 + 64 + 8 * 4 + 8);
        assert_eq!(
            std::mem::size_of::<CollParams>(),
            112 + 32 + 128 + 32 + 2 * MAX_SEGS * 32
        );
        assert_eq!(std::mem::size_of::<P2pOp>(), 24);
        assert_eq!(
            std::mem::size_of::<P2pParams>(),
            112 + 8 + 64 + 8 + 8 + MAX_P2P * 24
        );
        assert_eq!(std::mem::size_of::<PipeSync>(), 112 + 3 * 8 + 2 * 4);
        assert_eq!(
            std::mem::size_of::<LlParams>(),
            112 + 4 * 8 + 64 + 4 * 8 + 2 * 4
        );
        assert!(std::mem::size_of::<CollParams>() <= 4096);
        assert!(std::mem::size_of::<P2pParams>() <= 4096);
    }
}
