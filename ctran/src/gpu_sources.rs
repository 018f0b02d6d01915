//! Every CUDA C source the engine compiles, with the name it is compiled under: what
//! `torchcomms-prebuild-kernels` compiles ahead of time, so the names and bytes match the ones
//! the engine asks for at run time.

/// (name, source) of every kernel source, as the engine passes them to NVRTC (each starts with
/// `gpu_compat.cuh`, so the same text also compiles for AMD GPUs: ctran/tests/hip_compile.rs).
pub fn gpu_sources() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            crate::cuda::kernels::REDUCE_SOURCE_NAME,
            crate::cuda::kernels::REDUCE_SOURCE,
        ),
        (
            crate::gpe::kernels::GPE_SOURCE_NAME,
            crate::gpe::kernels::gpe_source(),
        ),
        (
            crate::nvl::kernels::NVL_SOURCE_NAME,
            crate::nvl::kernels::nvl_source(),
        ),
        (
            crate::moe::alltoallv::ALLTOALLV_SOURCE_NAME,
            crate::moe::alltoallv::alltoallv_source(),
        ),
        (
            crate::moe::kernels::MOE_SOURCE_NAME,
            crate::moe::kernels::moe_source(),
        ),
        (
            crate::nvl::window::WINDOW_SOURCE_NAME,
            crate::nvl::window::window_source(),
        ),
    ]
}
