//! Safe RAII types over libibverbs: each handle owns its parents through an `Arc` (a QP keeps
//! its PD and CQ, a PD its context), is released in `Drop` (which logs and never panics), and
//! offers `as_raw()` as the documented escape hatch.

mod context;
mod cq;
mod device;
mod endpoint;
mod mr;
mod qp;

pub use context::{Context, DeviceAttr, LinkLayer, PortAttr, ProtectionDomain};
pub use cq::CompletionQueue;
pub use device::{Device, DeviceList};
pub use endpoint::{mtu_bytes, QpEndpoint};
pub use mr::{MemoryRegion, DEFAULT_ACCESS};
pub use qp::{Init, PathConfig, QpCaps, QueuePair, Reset, Rtr, Rts, Verbs};
