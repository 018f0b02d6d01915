//! # torchcomms-hip-on-cuda
//!
//! A stand-in for AMD's `libamdhip64` (the HIP runtime and hiprtc) built over NVIDIA's CUDA
//! driver and NVRTC, so that the engine's HIP code paths (`torchcomms-cuda` with
//! `TORCHCOMMS_GPU_PLATFORM=hip`, loading this library through `TORCHCOMMS_HIP_LIB`) run on the
//! NVIDIA GPUs we have. It is the honest software model of the HIP interface the guide asks for
//! where hardware is missing: each `hip*` function does what HIP documents, by the CUDA call of
//! the same meaning (HIP was designed as that mapping; AMD ships the same for NVIDIA GPUs as
//! headers).
//!
//! What it proves: the engine's host side on HIP (device selection per thread, streams,
//! events, memory, IPC between processes, graphs, stream waits on memory, module loading and
//! launches, hiprtc's calls) is wired right. What it cannot: anything AMD (the kernels compile
//! here as CUDA through NVRTC, so their HIP branch of `gpu_compat.cuh` never runs; coherence of
//! coarse- and fine-grained memory; Infinity Fabric). docs/amd.md says so.
//!
//! It calls cudarc's driver functions itself rather than `torchcomms-cuda`'s types: those
//! dispatch on the process's platform, which is HIP in every process that loads this library,
//! and would call back into it. Only `torchcomms-cuda`'s NVRTC compilation (no platform) is
//! shared.
//!
//! Every function returns the CUDA status as the `hipError_t` (the codes the engine checks
//! have the same values in both: 0, 1, 100, 101, 600, 704).

// Each exported function's contract is HIP's own for the function of the same name (valid
// out-pointers, live handles), which its doc names; repeating it per function adds nothing.
#![allow(clippy::missing_safety_doc)]

mod device;
mod module;
mod rtc;
mod runtime;

pub use device::*;
pub use module::*;
pub use rtc::*;
pub use runtime::*;
