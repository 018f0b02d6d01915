//! The NVLink transport: ranks of one host whose GPUs reach each other's memory move data with
//! kernels that load and store peer memory directly (CUDA IPC), synchronised by flags in peer
//! memory. Nothing on the host waits for the device: an operation is one kernel launch on the
//! comm's stream, ordered after the caller's stream like NCCL's (a synchronous one-kernel op on
//! the caller's stream itself), and capturable in CUDA graphs.
//!
//! At comm creation every rank allocates a flag array and an arena (two halves for staged
//! collectives, a ring per peer for sends and receives, the low-latency region, the pipeline's
//! scratch) and exchanges their IPC handles;
//! the transport is on only when every rank is on this host, sees every peer's device and can
//! reach it (`cuDeviceCanAccessPeer`); otherwise the caller keeps the host-transport path (the
//! GPE). [`plan`] says how each collective maps onto the kernels (small all_reduces take the
//! low-latency kernel, the rest the collective kernel); [`registry`] caches the IPC
//! handles of user buffers for direct mode. Large all_reduces run [`pipeline`]d instead: copy
//! engines move the data on side streams, kernels only reduce and order.
//!
//! Memory: the flag array (80 KiB), the arena (`2 x CTRAN_NVL_STAGED_MAX_BYTES` plus
//! `CTRAN_NVL_P2P_SLOTS x CTRAN_NVL_P2P_SLOT_BYTES` per peer plus the low-latency region,
//! `4 x CTRAN_NVL_LL_MAX_BYTES` per rank, plus `CTRAN_NVL_PIPE_BYTES` of pipeline scratch) and
//! nothing per operation: direct mode works in the user's buffers.

pub mod kernels;
pub mod pipeline;
pub mod plan;
pub mod registry;
pub mod window;

mod exchange;
mod issue;
mod lanes;
mod mode;
mod setup;
mod status;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::comm::{Comm, KeepAlive};
use crate::cuda::ipc::Mapped;
use crate::cuda::{Context, CudaError, DeviceBuffer, Event, PinnedBuffer, RawStream, Stream};
use crate::error::Error;
use crate::gpe::cuda_err;
use kernels::{NvlKernels, MAX_RANKS};
use plan::Layout;
use registry::Registry;

/// How the transport is set up (from the `CTRAN_NVL_*` cvars).
#[derive(Debug, Clone)]
pub struct NvlConfig {
    /// Largest per-rank input of a staged collective; larger ones go direct.
    pub staged_max_bytes: usize,
    /// Largest all_reduce input of the low-latency path (0: off).
    pub ll_max_bytes: usize,
    /// Bytes of one slot of a point-to-point ring.
    pub p2p_slot_bytes: usize,
    /// Slots per peer.
    pub p2p_slots: usize,
    /// Blocks of staged and p2p kernels (0: one per multiprocessor); direct ones run twice as
    /// many (at most 256).
    pub blocks: usize,
    /// `auto`, `staged` or `direct`.
    pub mode: String,
    /// Device memory the transport may allocate per comm.
    pub budget_bytes: usize,
    /// Scratch of the pipelined all_reduce (0: off).
    pub pipe_bytes: usize,
    /// Its largest chunk (0: automatic).
    pub pipe_chunk_bytes: usize,
    /// The smallest all_reduce `auto` pipelines.
    pub pipe_min_bytes: usize,
    /// The smallest broadcast `auto` runs on copy engines.
    pub pipe_bcast_min_bytes: usize,
}

/// The NVLink transport of one communicator on one device.
#[derive(Debug)]
pub struct Nvl {
    comm: Arc<Comm>,
    /// Carries the per-operation address exchanges of direct mode, apart from the comm's own
    /// host operations so the two never interleave differently on different ranks.
    control: Comm,
    ctx: Arc<Context>,
    kernels: Arc<NvlKernels>,
    /// Blocks of staged collectives.
    grid: u32,
    /// Blocks of point-to-point launches and of the pipeline's reductions.
    sm_grid: u32,
    /// Blocks of direct collectives (a superset of `grid`'s).
    direct_grid: u32,
    layout: Layout,
    p2p_ring: [u64; MAX_RANKS],
    config: NvlConfig,
    flags: DeviceBuffer,
    counters: DeviceBuffer,
    _arena: DeviceBuffer,
    peer_flags: [u64; MAX_RANKS],
    _peers: Vec<Mapped>,
    status: Arc<PinnedBuffer>,
    pre: Event,
    /// Orders the stream an operation runs on after the one holding the comm's latest.
    join: Event,
    /// The pipeline's side lanes (scatter, reduce, gather), and the event that orders lanes.
    lanes: [Stream; 3],
    order: Event,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    /// Buffers of operations in flight, dropped once their event has completed.
    pending: VecDeque<(Arc<Event>, KeepAlive)>,
    /// The caller's stream that holds the comm's latest operation, when a synchronous one ran
    /// there instead of on the comm's stream; `None` when the comm's stream holds it.
    tail: Option<RawStream>,
}

fn cuda(op: &str, rank: usize) -> impl Fn(CudaError) -> Error + '_ {
    move |e| cuda_err(op, rank, e)
}

impl Drop for Nvl {
    fn drop(&mut self) {
        // The stream belongs to the caller (the GPE's): our memory must outlive the kernels
        // already launched on it, so wait for the last one.
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some((ev, _)) = inner.pending.back() {
            if let Err(e) = ev.synchronize() {
                tracing::warn!("nvl: waiting for the last operation: {e}");
            }
        }
        inner.pending.clear();
        let _ = self.control.finalize();
    }
}
