//! The GPU progress engine's two kernels (`kernels/gpe.cu`): `post` raises a flag in mapped host
//! memory, `wait` holds the stream until the host raises one. Compiled by NVRTC at first use
//! and loaded once per device, like the reduction kernels.

use std::sync::{Arc, OnceLock};

use crate::cuda::error::Result;
use crate::cuda::kernels::{load_once, PerDevice};
use crate::cuda::{Context, Function, Module, RawStream};

/// Source of the flag kernels: the CUDA/HIP compatibility header, then `kernels/gpe.cu`.
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

    /// On `stream`: wait until the mapped counter at `flag` reaches `step`.
    ///
    /// # Safety
    /// As for [`GpeKernels::post`]; and someone must raise the counter, or the stream waits
    /// forever.
    pub unsafe fn wait(&self, flag: u64, step: u64, stream: RawStream) -> Result<()> {
        self.launch_flag(self.wait, flag, step, stream)
    }
}
