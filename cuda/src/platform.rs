//! Which GPU runtime this process drives: CUDA on NVIDIA GPUs, HIP on AMD GPUs. PyTorch's
//! builds are one or the other (AMD GPUs appear as `cuda` devices on ROCm builds), so the
//! choice is made once per process (`TORCHCOMMS_GPU_PLATFORM`, default `auto`) and every type
//! of this crate dispatches on it: the engine above holds the same `Context`, streams, events,
//! memory, IPC handles and kernels whichever runtime is underneath.
//!
//! The HIP half has never run on an AMD GPU (docs/amd.md).

use std::sync::OnceLock;

/// A GPU runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// NVIDIA: the CUDA driver API and NVRTC.
    Cuda,
    /// AMD: the HIP runtime and hiprtc (ROCm).
    Hip,
}

impl Platform {
    /// `CUDA` or `HIP`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Cuda => "CUDA",
            Platform::Hip => "HIP",
        }
    }
}

/// The runtime of this process, chosen at the first call: `TORCHCOMMS_GPU_PLATFORM`, or with
/// `auto`, CUDA when its driver sees a GPU, else HIP when ROCm sees one, else CUDA (whose
/// absence then explains every error).
pub fn platform() -> Platform {
    static CHOSEN: OnceLock<Platform> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        choose(
            torchcomms_cvars::current().torchcomms_gpu_platform(),
            crate::driver::cuda_sees_a_gpu,
            torchcomms_hip::is_available,
        )
    })
}

/// The choice, given the cvar's value and probes of each runtime (probed only as needed).
fn choose(
    setting: &str,
    cuda_usable: impl FnOnce() -> bool,
    hip_usable: impl FnOnce() -> bool,
) -> Platform {
    match setting {
        "hip" => Platform::Hip,
        "cuda" => Platform::Cuda,
        _ if cuda_usable() => Platform::Cuda,
        _ if hip_usable() => Platform::Hip,
        _ => Platform::Cuda,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_prefers_cuda_then_hip_and_a_setting_wins() {
        assert_eq!(choose("auto", || true, || true), Platform::Cuda);
        assert_eq!(choose("auto", || false, || true), Platform::Hip);
        assert_eq!(choose("auto", || false, || false), Platform::Cuda);
        assert_eq!(
            choose("hip", || panic!("not probed"), || panic!("not probed")),
            Platform::Hip
        );
        assert_eq!(
            choose("cuda", || panic!("not probed"), || false),
            Platform::Cuda
        );
    }
}
