//! # ctran
//!
//! The collective-communication engine of torchcomms-rs. A [`Comm`](comm::Comm) joins `size`
//! ranks through a [`Store`](bootstrap::Store), connects them over the transports available
//! (TCP sockets today), and runs collectives strictly in issue order on one progress thread per
//! communicator.
#![doc = "\n\nSee `docs/ARCHITECTURE.md` for the layers."]

pub mod bootstrap;
pub mod cuda;
pub mod error;
pub mod kernels;
pub mod span;
pub mod types;

pub use error::{Error, Result};
pub use span::Span;
pub use types::{DataType, Device, ReduceOp};
pub mod algos;
pub mod comm;
pub mod gpe;
pub mod mixed;
pub mod nvl;
pub mod transport;

pub use comm::{Comm, CommConfig, Op, P2p, Request, RequestStatus};
