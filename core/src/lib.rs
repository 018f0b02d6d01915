//! # torchcomms-core
//!
//! What every layer of torchcomms-rs shares, so that the API crate, the vendor backends, the
//! analyzer and the bindings never depend on the `ctran` engine:
//!
//! - [`DataType`], [`ReduceOp`], [`Device`]: the vocabulary of every operation;
//! - [`Span`]: a buffer descriptor (address and length) that crosses layers;
//! - [`bootstrap`]: the [`Store`](bootstrap::Store) trait, a store speaking the wire protocol of
//!   `torch.distributed.TCPStore` (client and server), launcher discovery and rendezvous;
//! - [`ops`]: the table of operations every surface (API, Python, C) is generated from;
//! - [`Error`]: the kinds of failure every layer reports (bad argument, timeout, lost peer...).
//!
//! ```
//! use torchcomms_core::{DataType, ReduceOp};
//! assert_eq!(DataType::BF16.size_bytes(), 2);
//! assert!(ReduceOp::BXor.check_dtype(DataType::F32).is_err());
//! ```

pub mod bootstrap;
pub mod error;
pub mod ops;
pub mod span;
pub mod types;

pub use error::{Error, Result};
pub use span::Span;
pub use types::{DataType, Device, ReduceOp};

/// The per-operation timeout when neither the caller nor `TORCHCOMM_TIMEOUT_SECONDS` sets one.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
