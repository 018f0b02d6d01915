//! # torchcomms-cuda
//!
//! The GPU runtime the engine drives, without a toolkit at build time: the CUDA driver and NVRTC
//! on NVIDIA GPUs (cudarc's dynamic loading, libraries found by [`libs`]), or HIP and hiprtc
//! on AMD GPUs (through `torchcomms-hip`; never run on an AMD GPU, docs/amd.md). The process's
//! [`platform`] picks one and every type dispatches on it. The kernels' sources live in this
//! folder and compile at first use for the device's architecture.
//!
//! - [`driver`]: the runtime and each device's context; [`stream`]: streams and events;
//!   [`memory`]: device memory and copies; [`module`]: kernels and launches; [`pinned`]:
//!   mapped host memory; [`ipc`]: memory shared between processes; [`graph`]: capture.
//! - [`nvrtc`]: run-time compilation with an on-disk cache keyed by source hash, architecture
//!   and driver version (hiprtc on AMD GPUs, see [`kernels::load_once`]).
//! - [`kernels`]: the reductions of every (dtype, op) pair, mirroring the CPU kernels.
//! - [`libs`]: where NVIDIA's libraries are looked for (env, CUDA_HOME, PyTorch's wheels).
//!
//! Nothing here panics when CUDA is absent: [`is_available`] and [`unavailable_reason`] say
//! whether it can be used, and every entry point returns [`CudaError`] otherwise.
//!
//! ```no_run
//! use torchcomms_cuda::{self as cuda, Context, DeviceBuffer, RawStream, ReduceKernels};
//! # fn main() -> Result<(), cuda::CudaError> {
//! if let Some(why) = cuda::unavailable_reason() {
//!     println!("skipping: {why}");
//!     return Ok(());
//! }
//! let ctx = Context::get(0)?;
//! let a = DeviceBuffer::from_host(&ctx, &1.5f32.to_le_bytes().repeat(4))?;
//! let k = ReduceKernels::get(&ctx)?;
//! // SAFETY: `a` holds 4 f32 and outlives the kernel (the read below waits for it).
//! unsafe {
//!     k.combine(torchcomms_core::DataType::F32, torchcomms_core::ReduceOp::Sum, a.as_ptr(), a.as_ptr(), a.as_ptr(),
//!               4, RawStream::DEFAULT)?;
//! }
//! let mut out = [0u8; 16];
//! a.read(0, &mut out)?; // 3.0 four times
//! # Ok(()) }
//! ```

pub mod dmabuf;
pub mod driver;
pub mod error;
pub mod graph;
pub mod ipc;
pub mod kernels;
pub mod libs;
pub mod memory;
pub mod module;
pub mod nvrtc;
pub mod pinned;
pub mod platform;
pub mod stream;

pub use driver::{driver, is_available, unavailable_reason, Context};
pub use error::CudaError;
pub use graph::{
    begin_capture, end_capture, relax_capture_mode_for_this_thread, CaptureMode, Graph,
};
pub use kernels::ReduceKernels;
pub use memory::{
    copy_async, copy_dtod_sync, copy_dtoh_sync, copy_htod_sync, copy_peer_async, live_bytes,
    DeviceBuffer,
};
pub use module::{DeviceRepr, Function, LaunchArgs, Module};
pub use pinned::{copy_any_async, PinnedBuffer};
pub use platform::{platform, Platform};
pub use stream::{Event, RawStream, Stream};
