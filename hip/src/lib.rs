//! # torchcomms-hip
//!
//! AMD GPUs for torchcomms-rs: the HIP runtime (`libamdhip64`) and hiprtc, loaded at run time,
//! so that building needs no ROCm and one binary runs on machines with and without it.
//!
//! - [`sys`]: the few C functions used, looked up once (`TORCHCOMMS_HIP_LIB`,
//!   `TORCHCOMMS_HIPRTC_LIB` override the search); why no binding crate is used is said there.
//! - [`runtime`]: [`availability`] ("ROCm not found" / "no AMD GPU" / the GPU count), device
//!   memory, streams, events and IPC mappings, each released on drop.
//! - [`device`]: device properties, PCI bus ids and peer access; [`host`]: pinned host memory
//!   mapped for kernels; [`graph`]: stream capture and replay.
//! - [`rtc`]: the project's kernel sources compiled for an AMD architecture;
//!   [`module`]: code objects loaded and their kernels launched, and the architecture to
//!   compile for ([`target_arch`]).
//!
//! **What has run**: loading, the "no AMD GPU" report and hiprtc compilation on machines
//! without an AMD GPU (ROCm 5.2 from Debian). **What never ran**: everything that needs an AMD
//! GPU (memory, streams, events, IPC, loading a code object). See `docs/amd.md`.
//!
//! Thread safety: the library tables are immutable after loading; the RAII types are `Send`
//! and `Sync` as HIP allows its handles to be used from any thread.
//!
//! ```
//! match torchcomms_hip::availability() {
//!     Ok(n) => println!("{n} AMD GPUs"),
//!     Err(e) => println!("HIP unavailable: {e}"), // "ROCm not found: ..." or "no AMD GPU: ..."
//! }
//! ```

pub mod device;
pub mod error;
pub mod graph;
pub mod host;
pub mod module;
pub mod rtc;
pub mod runtime;
pub mod sys;

pub use device::{device_info, DeviceInfo};
pub use error::{HipError, Result};
pub use host::PinnedHost;
pub use module::{target_arch, Function, Module};
pub use runtime::{
    allocation_of, availability, copy_async, copy_peer_async, copy_sync, ipc_handle_of,
    is_available, relax_capture_mode_for_this_thread, runtime_version, set_device,
    stream_is_capturing, stream_synchronize, stream_wait_event, stream_wait_value64, DeviceBuffer,
    Event, IpcMapping, Stream,
};
pub use sys::HipIpcMemHandle;
