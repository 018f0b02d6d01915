//! # ibverbx
//!
//! InfiniBand/RoCE verbs for torchcomms-rs: libibverbs loaded at run time, safe RAII types
//! over it, and **virtual queue pairs** that spread one logical connection over several
//! physical RC queue pairs (upstream's `comms/ctran/ibverbx`), with an in-process software
//! provider so all of the virtual-QP logic is tested on machines without RDMA hardware.
//!
//! | module | what |
//! |---|---|
//! | [`sys`] | raw declarations of the verbs.h structures and functions used (written by hand) |
//! | [`loader`] | run-time loading: [`availability`], [`supported`], the symbol table |
//! | [`mlx5dv`] | libmlx5 loaded where present: Data Direct registration of GPU memory |
//! | [`verbs`] | safe types: [`verbs::DeviceList`], [`verbs::Context`], [`verbs::ProtectionDomain`], [`verbs::MemoryRegion`], [`verbs::CompletionQueue`], [`verbs::QueuePair`] (typestate RESET→INIT→RTR→RTS), [`verbs::QpEndpoint`] |
//! | [`provider`] | the traits a virtual QP runs on ([`QpOps`], [`CqOps`], [`Provider`]) |
//! | [`virt`] | [`VirtualQp`], [`VirtualCq`], DQPLB sequence tracking ([`virt::seq`]) |
//! | [`soft`] | the software provider |
//! | [`hca`], [`config`] | `CTRAN_IB_HCA` parsing and matching, typed settings from cvars |
//!
//! ## Quick start (software provider; the same code runs over [`verbs::Verbs`])
//!
//! ```
//! use std::time::Duration;
//! use ibverbx::soft::{connect_pairs, Soft, SoftConfig, SoftFabric};
//! use ibverbx::{Event, Put, VirtualCq, VirtualQp, VqpConfig, VcMode};
//!
//! let fabric = SoftFabric::new(SoftConfig { reorder: true, ..SoftConfig::default() });
//! let (a, b) = (fabric.device("a"), fabric.device("b"));
//! let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
//! let (qa, qb) = connect_pairs(&a, &cq_a, &b, &cq_b, 4).unwrap();
//! let cfg = VqpConfig { chunk_bytes: 4096, mode: VcMode::Dqplb, ..VqpConfig::default() };
//! let mut vcq_a = VirtualCq::<Soft>::new(cq_a);
//! let mut vcq_b = VirtualCq::<Soft>::new(cq_b);
//! let tx = VirtualQp::new(&mut vcq_a, qa, cfg).unwrap();
//! let _rx = VirtualQp::new(&mut vcq_b, qb, cfg).unwrap();
//!
//! // Register once, put many times.
//! let src = a.register(100_000);
//! let dst = b.register(100_000);
//! src.write(0, &[7u8; 100_000]).unwrap();
//! tx.put(&Put {
//!     wr_id: 1,
//!     local: src.local_key(),
//!     local_offset: 0,
//!     remote: dst.remote_key(), // in a real job this comes from the peer, as bytes
//!     remote_offset: 0,
//!     len: 100_000,
//!     notify: true,
//! }).unwrap();
//!
//! let (mut sent, mut notified) = (false, false);
//! let mut events = Vec::new();
//! while !(sent && notified) {
//!     events.clear();
//!     vcq_a.poll(&mut events).unwrap();
//!     vcq_b.poll(&mut events).unwrap();
//!     for e in &events {
//!         match &e.event {
//!             Event::PutDone { wr_id: 1, result, .. } => { result.clone().unwrap(); sent = true }
//!             Event::Notify { seq: 0 } => notified = true,
//!             other => panic!("{other:?}"),
//!         }
//!     }
//! }
//! assert_eq!(dst.to_vec().unwrap(), vec![7u8; 100_000]);
//! # let _ = Duration::from_secs(1);
//! ```
//!
//! ## Native library
//!
//! Nothing of rdma-core is needed to build. At run time `libibverbs.so.1` is opened on first
//! use (or the path in `TORCHCOMMS_IBVERBS_LIB`); when it is missing, or lists no device,
//! [`availability`] says so ("libibverbs not found: ...", "no RDMA device ...") and every
//! verbs call returns an [`Error`]; the software provider and the virtual QPs work anyway.
//! `ibv_reg_dmabuf_mr` (GPU memory) is optional: [`Error::Unsupported`] without it. mlx5dv is
//! not loaded (no DC transport, no direct WQE writing).
//!
//! ## Why not the `ibverbs` or `sideway` crates
//!
//! - `ibverbs`/`ibverbs-sys` build a vendored rdma-core with CMake and run bindgen (clang) at
//!   build time, and link `-libverbs`: a binary using them does not start where libibverbs is
//!   absent, so IB could never be an optional, run-time choice.
//! - `sideway` (on `rdma-mummy-sys`) needs CMake and clang to build a stub library; without
//!   rdma-core at run time its calls return `EOPNOTSUPP` instead of a load error with a reason,
//!   and it favours the newer `ibv_wr_*` API over the classic post/poll calls used here.
//!
//! The verbs surface needed here is small (about twenty functions and a dozen structures of
//! rdma-core's stable ABI), so it is declared in [`sys`] and checked by a layout test.
//!
//! ## Thread safety and cleanup
//!
//! Verbs handles are `Send + Sync` (rdma-core's verbs are thread safe; posting takes
//! `&mut`). A [`VirtualQp`] may be shared across threads; a [`VirtualCq`] is polled by one.
//! Every handle releases its resource in `Drop`, after its children (a QP holds an `Arc` of its
//! PD and CQ); a failure there is logged with `tracing`, never a panic.

pub mod config;
mod error;
pub mod hca;
pub mod loader;
pub mod mlx5dv;
pub mod provider;
pub mod soft;
pub mod sys;
pub mod verbs;
pub mod virt;

pub use config::IbConfig;
pub use error::{Error, LoadError, Result};
pub use hca::{HcaEntry, HcaSpec};
pub use loader::{availability, supported, Availability};
pub use provider::{
    Completion, CqOps, LocalKey, Provider, QpOps, RdmaOp, RemoteKey, WcOpcode, WcStatus,
    WorkRequest,
};
pub use virt::{Event, Failure, Put, VcMode, VirtualCompletion, VirtualCq, VirtualQp, VqpConfig};
