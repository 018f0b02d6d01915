//! The reduction kernels of `kernels/reduce.cu` on one device: compiled at first use (see
//! [`nvrtc`](super::nvrtc)), loaded once per device, launched on a caller's stream.
//!
//! The three steps follow the CPU kernels of the ctran engine (`Reducer`): **prescale** each input
//! (`PremulSum`, float `Avg`), **combine** pairs of partials, **finish** the result (integer
//! `Avg`). Scalars are rounded to the element type on the host, exactly as the CPU kernels do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use half::{bf16, f16};
use sha2::{Digest, Sha256};

use super::driver::{driver, Context};
use super::error::{CudaError, Result};
use super::module::{Function, Module};
use super::nvrtc;
use super::platform::Platform;
use super::stream::RawStream;
use torchcomms_core::{DataType, ReduceOp};

/// What differs between CUDA and HIP (inline PTX under CUDA, clang builtins under HIP): the
/// first part of every kernel source of the project, so one source compiles with NVRTC for
/// NVIDIA GPUs and with hipcc/hiprtc for AMD GPUs (docs/amd.md).
pub const COMPAT_CUH: &str = include_str!("kernels/gpu_compat.cuh");

/// Helpers every kernel source of the project starts with (element loads and stores, the
/// reduction functors); other crates' kernels prepend it too, so all share one definition.
pub const COMMON_CUH: &str = include_str!("kernels/common.cuh");

/// Source of the reduction kernels.
pub const REDUCE_SOURCE: &str = concat!(
    include_str!("kernels/gpu_compat.cuh"),
    include_str!("kernels/common.cuh"),
    include_str!("kernels/reduce.cu")
);

/// A kernel source as the compilers see it: [`COMPAT_CUH`], then `parts`, joined once into
/// `cell` (sources of other crates cannot `concat!` a constant of this one).
pub fn with_compat(cell: &'static OnceLock<String>, parts: &[&str]) -> &'static str {
    cell.get_or_init(|| {
        std::iter::once(COMPAT_CUH)
            .chain(parts.iter().copied())
            .collect()
    })
}
/// Its name in logs and cache files.
pub const REDUCE_SOURCE_NAME: &str = "cuda/src/kernels/reduce.cu";

/// Threads per block of the reduction kernels (their `__launch_bounds__`).
pub const BLOCK: u32 = 512;

/// Kernels of one source loaded per device ordinal.
pub type PerDevice<T> = OnceLock<Mutex<HashMap<u32, Arc<T>>>>;

/// The kernels of `source` on device `ctx`: compiled by NVRTC (or read from the disk cache), or
/// on AMD GPUs by hiprtc for the GPU's architecture, and loaded at the first call for that
/// device, then shared; `make` wraps the loaded module.
pub fn load_once<T>(
    loaded: &PerDevice<T>,
    ctx: &Arc<Context>,
    name: &str,
    source: &str,
    make: impl FnOnce(Module, nvrtc::Image) -> Result<T>,
) -> Result<Arc<T>> {
    let mut map = loaded
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(k) = map.get(&ctx.ordinal()) {
        return Ok(Arc::clone(k));
    }
    if ctx.platform() == Platform::Hip {
        let image = hiprtc_image(name, source)?;
        let k = Arc::new(make(Module::load(ctx, &image.bytes)?, image)?);
        map.insert(ctx.ordinal(), Arc::clone(&k));
        return Ok(k);
    }
    let (cc, version) = (ctx.compute_capability(), driver()?.version);
    let mut image = nvrtc::compile(name, source, cc, version)?;
    let module = match Module::load(ctx, &image.bytes) {
        Ok(m) => m,
        Err(e) if image.prebuilt => {
            // An image compiled ahead of time that this driver refuses: compile here instead.
            tracing::warn!(
                name,
                "the kernels compiled ahead of time do not load ({e}); compiling"
            );
            image = nvrtc::compile_with(name, source, cc, version, false)?;
            Module::load(ctx, &image.bytes)?
        }
        Err(e) => return Err(e),
    };
    let k = Arc::new(make(module, image)?);
    map.insert(ctx.ordinal(), Arc::clone(&k));
    Ok(k)
}

/// `source` compiled by hiprtc for the AMD architecture of this machine
/// (`TORCHCOMMS_HIP_ARCH`, else the kernel driver's topology), or read from the kernel cache
/// (`TORCHCOMMS_KERNEL_CACHE`, as NVRTC's): hiprtc takes tens of seconds for the engine's
/// sources, which every process would otherwise pay at its first communicator. The file is
/// keyed by the source, hiprtc's version and the architecture.
pub fn hiprtc_image(name: &str, source: &str) -> Result<nvrtc::Image> {
    let arch = torchcomms_hip::target_arch()?;
    let (major, minor) = torchcomms_hip::rtc::version()?;
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update(format!("hiprtc {major}.{minor} -O3").as_bytes());
    let digest = nvrtc::hex8(&h.finalize());
    let file = format!("{}-{digest}-{arch}.hsaco", nvrtc::stem(name));
    let cache_path = nvrtc::cache_dir().map(|d| d.join(file));
    let (bytes, from_cache) = nvrtc::through_cache(cache_path.as_ref(), || {
        Ok(torchcomms_hip::rtc::compile(name, source, &arch)?)
    })?;
    Ok(nvrtc::Image {
        bytes,
        target: arch,
        cache_path,
        from_cache,
        prebuilt: false,
    })
}

/// The kernel of `reduce.cu` that combines two partials of `op` over `dtype`
/// (`tc_combine_<pair>_<type>`, taking `(T* dst, const T* a, const T* b, u64 n)`), and its
/// pairwise step's name: the same on CUDA and HIP.
pub fn combine_kernel(dtype: DataType, op: ReduceOp) -> Result<(String, &'static str)> {
    op.check_dtype(dtype).map_err(|e| CudaError::BadArgument {
        call: "combine",
        detail: e.to_string(),
    })?;
    // Averages and pre-multiplied sums combine as sums (their scaling is a step of its own).
    let pair = match op {
        ReduceOp::Avg | ReduceOp::PremulSum { .. } => ReduceOp::Sum.name(),
        _ => op.name(),
    };
    Ok((format!("tc_combine_{pair}_{}", dtype.name()), pair))
}

/// The reduction kernels loaded on one device.
#[derive(Debug)]
pub struct ReduceKernels {
    ctx: Arc<Context>,
    module: Module,
    funcs: Mutex<HashMap<String, Function>>,
    target: String,
    from_cache: bool,
}

impl ReduceKernels {
    /// The kernels of device `ctx`, compiled (or read from the cache) and loaded at first use.
    pub fn get(ctx: &Arc<Context>) -> Result<Arc<ReduceKernels>> {
        static LOADED: PerDevice<ReduceKernels> = OnceLock::new();
        load_once(
            &LOADED,
            ctx,
            REDUCE_SOURCE_NAME,
            REDUCE_SOURCE,
            |module, image| {
                Ok(ReduceKernels {
                    ctx: Arc::clone(ctx),
                    module,
                    funcs: Mutex::new(HashMap::new()),
                    target: image.target,
                    from_cache: image.from_cache,
                })
            },
        )
    }

    /// The target the kernels were built for (`sm_90`).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// True when the image came from the disk cache.
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    fn function(&self, name: &str, dtype: DataType, op: &str) -> Result<Function> {
        let mut f = self.funcs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = f.get(name) {
            return Ok(*k);
        }
        let k = self
            .module
            .function(name)
            .map_err(|_| CudaError::NoKernel {
                name: name.into(),
                dtype: dtype.name().into(),
                op: op.into(),
            })?;
        f.insert(name.to_string(), k);
        Ok(k)
    }

    fn grid(&self, n: usize) -> u32 {
        let blocks = n.div_ceil(BLOCK as usize).max(1);
        let cap = (self.ctx.sm_count().max(1) as usize) * 8;
        u32::try_from(blocks.min(cap)).unwrap_or(1)
    }

    /// `dst = a ⊕ b` over `n` elements (the pairwise step of `op`), on `stream`.
    ///
    /// # Safety
    /// `dst`, `a` and `b` must be device addresses of this context holding `n` elements of
    /// `dtype` until the kernel finishes; `dst` may equal `a` or `b`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn combine(
        &self,
        dtype: DataType,
        op: ReduceOp,
        dst: u64,
        a: u64,
        b: u64,
        n: usize,
        stream: RawStream,
    ) -> Result<()> {
        let (name, pair) = combine_kernel(dtype, op)?;
        if n == 0 {
            return Ok(());
        }
        let f = self.function(&name, dtype, pair)?;
        let count = n as u64;
        self.ctx.bind()?;
        // SAFETY: the kernel takes (T*, const T*, const T*, u64); the caller vouches for the
        // buffers; the module lives as long as self.
        unsafe {
            f.args()
                .arg(&dst)
                .arg(&a)
                .arg(&b)
                .arg(&count)
                .launch(self.grid(n), BLOCK, stream)
        }
    }

    /// `dst = src × factor` over `n` elements (prescale), `factor` rounded to the dtype first
    /// (through f32 for f16/bf16) like the CPU kernels.
    ///
    /// # Safety
    /// As for [`ReduceKernels::combine`].
    pub unsafe fn scale(
        &self,
        dtype: DataType,
        dst: u64,
        src: u64,
        n: usize,
        factor: f64,
        stream: RawStream,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let factor = match dtype {
            DataType::F32 => f64::from(factor as f32),
            DataType::F16 => f64::from(f16::from_f32(factor as f32).to_f32()),
            DataType::BF16 => f64::from(bf16::from_f32(factor as f32).to_f32()),
            DataType::Bool => {
                return Err(CudaError::BadArgument {
                    call: "scale",
                    detail: "bool tensors cannot be scaled".into(),
                })
            }
            _ => factor,
        };
        let f = self.function(&format!("tc_scale_{}", dtype.name()), dtype, "scale")?;
        let count = n as u64;
        self.ctx.bind()?;
        // SAFETY: the kernel takes (T*, const T*, u64, double); see combine.
        unsafe {
            f.args()
                .arg(&dst)
                .arg(&src)
                .arg(&count)
                .arg(&factor)
                .launch(self.grid(n), BLOCK, stream)
        }
    }

    /// `buf /= divisor` over `n` integer elements, truncating toward zero (integer `Avg`).
    ///
    /// # Safety
    /// As for [`ReduceKernels::combine`].
    pub unsafe fn divide(
        &self,
        dtype: DataType,
        buf: u64,
        n: usize,
        divisor: i64,
        stream: RawStream,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if dtype.is_float() || dtype == DataType::Bool || divisor == 0 {
            return Err(CudaError::BadArgument {
                call: "divide",
                detail: format!("integer division of {dtype} by {divisor}"),
            });
        }
        let f = self.function(&format!("tc_divide_{}", dtype.name()), dtype, "divide")?;
        let count = n as u64;
        self.ctx.bind()?;
        // SAFETY: the kernel takes (T*, u64, i64); see combine.
        unsafe {
            f.args()
                .arg(&buf)
                .arg(&count)
                .arg(&divisor)
                .launch(self.grid(n), BLOCK, stream)
        }
    }

    /// Prescales `buf` in place for `op` over `nranks` ranks (nothing for most ops).
    ///
    /// # Safety
    /// As for [`ReduceKernels::combine`].
    pub unsafe fn prescale(
        &self,
        dtype: DataType,
        op: ReduceOp,
        nranks: usize,
        buf: u64,
        n: usize,
        stream: RawStream,
    ) -> Result<()> {
        let factor = match op {
            ReduceOp::PremulSum { factor } => factor,
            ReduceOp::Avg if dtype.is_float() => 1.0 / nranks as f64,
            _ => return Ok(()),
        };
        // SAFETY: forwarded.
        unsafe { self.scale(dtype, buf, buf, n, factor, stream) }
    }

    /// Finishes the result of `op` over `nranks` ranks in place (integer `Avg` divides).
    ///
    /// # Safety
    /// As for [`ReduceKernels::combine`].
    pub unsafe fn finish(
        &self,
        dtype: DataType,
        op: ReduceOp,
        nranks: usize,
        buf: u64,
        n: usize,
        stream: RawStream,
    ) -> Result<()> {
        if op == ReduceOp::Avg && !dtype.is_float() {
            let d = i64::try_from(nranks).unwrap_or(i64::MAX);
            // SAFETY: forwarded.
            return unsafe { self.divide(dtype, buf, n, d, stream) };
        }
        Ok(())
    }
}
