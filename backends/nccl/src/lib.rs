//! # torchcomms-nccl
//!
//! The `nccl` backend: the TorchComm API on NVIDIA's NCCL, loaded at run time. Linking this
//! crate registers the backend under the name `nccl` (`use torchcomms_nccl as _;`).
//!
//! ```no_run
//! use torchcomms::{new_comm, CommOptions, Device, OpOptions, ReduceOp};
//! use torchcomms_nccl as _;
//! # fn main() -> torchcomms::Result<()> {
//! // One process per GPU; rank, size and MASTER_ADDR/MASTER_PORT from the launcher.
//! let comm = new_comm("nccl", Device::Cuda(0), "world", CommOptions::from_env()?)?;
//! # let t: torchcomms::Tensor = unimplemented!();
//! // `t` is a CUDA tensor (its owner keeps the memory alive); the stream is the caller's.
//! let work = comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::async_op().with_stream(0))?;
//! work.wait()?; // the caller's stream waits; the host does not
//! work.wait_blocking()?; // the host waits
//! comm.finalize()?;
//! # Ok(()) }
//! ```
//!
//! ## Native libraries
//! `libnccl.so.2` from `NCCL_LIB_PATH` (a file or folder), `LD_LIBRARY_PATH`, `CUDA_HOME`, or
//! PyTorch's wheels (`site-packages/nvidia/nccl/lib`); the CUDA driver (`libcuda.so.1`); NVRTC
//! only for the bitwise reductions NCCL lacks (see [`torchcomms_cuda`]). Nothing is needed at build
//! time: without them, creating a communicator fails with an error that says what was searched.
//!
//! ## `rccl`: AMD GPUs
//! The same crate registers `rccl`: RCCL (ROCm) exports NCCL's API under the same names, so the
//! symbol table and the backend are shared; `librccl.so.1` is looked for through `RCCL_LIB_PATH`,
//! `LD_LIBRARY_PATH`, `$ROCM_PATH/lib`, `/opt/rocm/lib` and the system loader. The backend's
//! streams, events, scratch memory and bitwise-reduction kernels go through HIP for `rccl`
//! (`torchcomms_hip`, behind the crate's `gpu` module) and CUDA for `nccl`. Without RCCL or an
//! AMD GPU it fails with "RCCL is not available" or "no AMD GPU"; none of the HIP half has run
//! on AMD hardware (docs/amd.md).
//!
//! ## Semantics (ProcessGroupNCCL's)
//! Each communicator has its own stream (high priority with
//! `CommOptions::high_priority_stream`). An operation waits for the caller's stream
//! (`OpOptions::stream`, default the legacy default stream), runs on the communicator's
//! stream, and records an event; `Work::wait()` makes the caller's stream wait for it without
//! blocking the host, `Work::wait_blocking()` blocks the host, `is_completed()` polls. Tensors'
//! owners are held until the event completes. A watchdog thread aborts the communicator
//! (`ncclCommAbort`) when an operation outlives its timeout or NCCL reports an error, and tells
//! the other ranks through the store; every later call fails with that error.
//!
//! Reductions NCCL lacks (band, bor, bxor; xor on bool) run as an all-gather (or all-to-all)
//! plus the project's NVRTC-compiled kernels (`torchcomms_cuda`). all_gather_v and reduce_scatter_v are grouped
//! broadcasts and reduces; all_to_all_v, scatter and gather are grouped send/recv.
//!
//! ## Thread safety and cleanup
//! A communicator may be used from several threads; enqueues are serialised. `finalize()`
//! waits for outstanding work and destroys the NCCL communicator; dropping does the same
//! without reporting errors.

mod backend;
mod comm;
mod enqueue;
pub mod error;
mod gpu;
mod ops;
mod sys;
mod work;

pub use backend::NcclBackend;
pub use error::NcclError;
pub use sys::{is_available, Vendor};

use torchcomms::BackendRegistration;

inventory::submit! {
    BackendRegistration { name: "nccl", create: NcclBackend::create }
}

// AMD's RCCL exports NCCL's API: the same backend, loading librccl (docs/amd.md).
inventory::submit! {
    BackendRegistration { name: "rccl", create: NcclBackend::create_rccl }
}

/// The RCCL library's version, or why it cannot be loaded (`rccl` backend).
pub fn rccl_version() -> Result<String, NcclError> {
    sys::library(Vendor::Rccl).map(|n| n.version_string())
}

/// The NCCL library's version (`2.28.9`), or why it cannot be loaded.
pub fn nccl_version() -> Result<String, NcclError> {
    sys::nccl().map(|n| n.version_string())
}

/// Where libnccl was loaded from.
pub fn nccl_path() -> Result<std::path::PathBuf, NcclError> {
    sys::nccl().map(|n| n.path.clone())
}
