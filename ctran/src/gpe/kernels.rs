//! The GPU progress engine's kernels (`kernels/gpe.cu`): `post` raises a flag in mapped host
//! memory, `wait` holds the stream until the host raises one, and `land` copies the ranges a
//! host-filled list names from mapped staging into device memory (windows over host
//! transports). Compiled by NVRTC at first use and loaded once per device, like the reduction
//! kernels.
//!
//! A wait is a stream memory operation (`cuStreamWaitValue64`) where the driver takes one, the
//! kernel otherwise. Several processes sharing a GPU (ranks of one job on one device) each hold
//! a waiting stream; a spinning kernel keeps its context on the GPU, while a memory-operation
//! wait lets the GPU run the other contexts' work that the wait depends on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::cuda::error::Result;
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{Context, Function, Module, RawStream};

/// A copy the device makes once an operation's host part is done: the byte ranges the host
/// listed at `list` go from `staging` to `window` (all device addresses; the list and staging
/// are mapped pinned memory). A window over host transports lands its peers' puts this way
/// when its owner's wait for their signal passes ([`crate::window::staged`]).
#[derive(Debug, Clone, Copy)]
pub struct DeviceLanding {
    /// The list: a count, then (offset, length) pairs.
    pub list: u64,
    /// Where the ranges are read.
    pub staging: u64,
    /// Where they are written, at the same offsets.
    pub window: u64,
}

/// Source of the kernels: the CUDA/HIP compatibility header, then `kernels/gpe.cu`.
pub fn gpe_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    crate::cuda::kernels::with_compat(&SOURCE, &[include_str!("kernels/gpe.cu")])
}
/// Its name in logs and cache files.
pub const GPE_SOURCE_NAME: &str = "ctran/src/gpe/kernels/gpe.cu";

/// The flag kernels loaded on one device.
#[derive(Debug)]
pub struct GpeKernels {
    ctx: Arc<Context>,
    _module: Module,
    post: Function,
    wait: Function,
    land: Function,
    /// Whether waits still try the stream memory operation (cleared at its first refusal).
    wait_value: AtomicBool,
}

impl GpeKernels {
    /// The kernels of device `ctx`, compiled (or read from the cache) and loaded at first use.
    pub fn get(ctx: &Arc<Context>) -> Result<Arc<GpeKernels>> {
        static LOADED: PerDevice<GpeKernels> = OnceLock::new();
        load_once(&LOADED, ctx, GPE_SOURCE_NAME, gpe_source(), |module, _| {
            Ok(GpeKernels {
                ctx: Arc::clone(ctx),
                post: module.function("gpe_post")?,
                wait: module.function("gpe_wait")?,
                land: module.function("gpe_land")?,
                wait_value: AtomicBool::new(true),
                _module: module,
            })
        })
    }

    fn launch_flag(&self, f: Function, flag: u64, step: u64, stream: RawStream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both kernels take (volatile u64*, u64); the caller vouches for the flag's
        // address; the module lives as long as self.
        unsafe { f.args().arg(&flag).arg(&step).launch(1, 1, stream) }
    }

    /// On `stream`: raise the mapped counter at device address `flag` to `step`.
    ///
    /// # Safety
    /// `flag` must be the device address of 8 bytes of mapped pinned memory that stays
    /// allocated until the kernel has run.
    pub unsafe fn post(&self, flag: u64, step: u64, stream: RawStream) -> Result<()> {
        self.launch_flag(self.post, flag, step, stream)
    }

    /// On `stream`: copy the ranges of the list at device address `list` (mapped pinned memory:
    /// a count, then offset and length pairs) from `staging` (mapped pinned memory) to the same
    /// offsets of device memory at `window`.
    ///
    /// # Safety
    /// The list must be filled before the kernel runs (a wait ahead of it on the stream) and
    /// every range must lie inside both `staging` and `window`, which stay allocated until the
    /// kernel has run.
    pub unsafe fn land(
        &self,
        list: u64,
        staging: u64,
        window: u64,
        stream: RawStream,
    ) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the kernel takes (const volatile u64*, const u8*, u8*); the caller vouches
        // for the addresses; the module lives as long as self.
        unsafe {
            self.land
                .args()
                .arg(&list)
                .arg(&staging)
                .arg(&window)
                .launch(32, 256, stream)
        }
    }

    /// On `stream`: wait until the mapped counter at `flag` reaches `step`.
    ///
    /// # Safety
    /// As for [`GpeKernels::post`]; and someone must raise the counter, or the stream waits
    /// forever.
    pub unsafe fn wait(&self, flag: u64, step: u64, stream: RawStream) -> Result<()> {
        if self.wait_value.load(Ordering::Relaxed) {
            self.ctx.bind()?;
            // SAFETY: forwarded to the caller (the flag is mapped pinned memory).
            match unsafe { stream.wait_value_geq(flag, step) } {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!("GPE: stream memory waits refused ({e}); waiting in a kernel");
                    self.wait_value.store(false, Ordering::Relaxed);
                }
            }
        }
        self.launch_flag(self.wait, flag, step, stream)
    }
}
