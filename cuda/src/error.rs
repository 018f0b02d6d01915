//! Errors of the CUDA layer: each names the call or library that failed and what was tried.

use std::path::PathBuf;

/// Result alias of the CUDA layer.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// What can go wrong between this process and the GPU.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A shared library could not be found or loaded.
    #[error("cannot load {lib}: {reason} (searched: {searched})")]
    LibraryNotFound {
        /// The library (`libcuda`, `libnvrtc`, `libnccl`).
        lib: String,
        /// Why the last candidate failed.
        reason: String,
        /// Every candidate tried, in order.
        searched: String,
    },
    /// A call of the CUDA driver returned an error.
    #[error("{call} failed: {source}")]
    Driver {
        /// The driver call (`cuMemAlloc`, `cuLaunchKernel`, ...).
        call: &'static str,
        /// The driver's code and message.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// No device of that ordinal.
    #[error("no CUDA device {ordinal}: this process sees {count}")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices visible.
        count: u32,
    },
    /// A call of NVRTC returned an error.
    #[error("NVRTC {call} failed: {source}")]
    Nvrtc {
        /// The NVRTC call.
        call: &'static str,
        /// NVRTC's code.
        #[source]
        source: cudarc::nvrtc::result::NvrtcError,
    },
    /// NVRTC refused a kernel source.
    #[error("NVRTC could not compile {source_name} for {arch}:\n{log}")]
    Compile {
        /// The source file.
        source_name: String,
        /// The target (`sm_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// The kernel cache could not be read or written.
    #[error("kernel cache {path}: {reason}")]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A kernel the module should contain is missing.
    #[error("no kernel {name} for dtype {dtype} and op {op}")]
    NoKernel {
        /// Kernel name looked up.
        name: String,
        /// Element type.
        dtype: String,
        /// Reduction.
        op: String,
    },
    /// A call of the HIP runtime or hiprtc failed (AMD GPUs), or ROCm is absent.
    #[error(transparent)]
    Hip(#[from] torchcomms_hip::HipError),
    /// What this runtime does not offer (named, with the platform).
    #[error("{what} is not available on {platform}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// `CUDA` or `HIP`.
        platform: &'static str,
    },
    /// A buffer argument does not fit the call.
    #[error("{call}: {detail}")]
    BadArgument {
        /// The call.
        call: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// Turns a driver result into ours, naming the call.
pub(crate) trait DriverResultExt<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> DriverResultExt<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| CudaError::Driver { call, source })
    }
}

impl CudaError {
    /// True when the driver said the event or stream has work left (`CUDA_ERROR_NOT_READY`).
    pub fn is_not_ready(&self) -> bool {
        matches!(self, CudaError::Driver { source, .. }
            if source.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY)
    }
}
