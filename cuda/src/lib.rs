//! # torchcomms-cuda
//!
//! CUDA without the toolkit at build time: the driver and NVRTC are loaded at run time
//! (cudarc's dynamic loading, libraries found by [`libs`]), and the kernels' CUDA C sources
//! live in this folder and compile at first use for the device's architecture.
//!
//! - [`driver`]: devices, primary contexts, streams, events, device memory, kernel launches.
//! - [`nvrtc`]: run-time compilation with an on-disk cache keyed by source hash, architecture
//!   and driver version.
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
pub mod nvrtc;
pub mod pinned;

pub use driver::{
    copy_async, copy_dtod_sync, copy_dtoh_sync, copy_htod_sync, copy_peer_async, driver,
    is_available, unavailable_reason, Context, DeviceBuffer, DeviceRepr, Event, Function,
    LaunchArgs, Module, RawStream, Stream,
};
pub use error::CudaError;
pub use graph::{
    begin_capture, end_capture, relax_capture_mode_for_this_thread, CaptureMode, Graph,
};
pub use kernels::ReduceKernels;
pub use pinned::{copy_any_async, PinnedBuffer};
