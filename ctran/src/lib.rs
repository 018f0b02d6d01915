//! # ctran
//!
//! The collective-communication engine of torchcomms-rs. A [`Comm`](comm::Comm) joins `size`
//! ranks through a [`Store`](bootstrap::Store), connects them over the transports available
//! (TCP between hosts, shared memory within one, NVLink between GPUs of one host), and runs
//! operations strictly in issue order on one progress thread per communicator.
#![doc = "\n\nSee `docs/ARCHITECTURE.md` for the layers."]

pub use torchcomms_core::{bootstrap, error, span, types};
pub use torchcomms_cuda as cuda;

pub mod kernels;

pub use error::{Error, Result};
pub use span::Span;
pub use types::{DataType, Device, ReduceOp};
pub mod algos;
pub mod comm;
pub mod engine;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gpe;
mod gpu_sources;
pub use gpu_sources::gpu_sources;
pub mod mixed;
pub mod moe;
pub mod nvl;
pub mod rdma;
pub mod shm_collectives;
pub mod transport;
pub mod window;

pub use comm::{Comm, CommConfig, FinishCallback, Op, P2p, Request, RequestStatus};
