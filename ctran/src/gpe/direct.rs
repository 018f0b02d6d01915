//! GPUDirect RDMA for the GPU progress engine: sends and receives whose peers ib carries move
//! between the NIC and the tensors themselves instead of through pinned host staging.
//!
//! Each allocation behind such a buffer is registered with ib once, through the dma-buf its
//! driver exports, and kept (keyed by its start and buffer id, as the NVLink registry keys its
//! exports): an address freed and allocated again shows a new id, and its old registration is
//! dropped first. The host operation then names the device buffers; the ib transport finds
//! them registered and never touches their bytes. A driver without dma-buf export is asked
//! once; from then on everything stages, as before.
//!
//! Only transfers of at least `CTRAN_IB_GPU_DIRECT_MIN_BYTES` go in place: the stream of one
//! waits until the NIC is done with the buffer, so a send waits for its receiver (as NCCL's
//! large sends do), while a staged send lets its stream go on once the data is staged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::comm::Comm;
use crate::cuda::{ipc, Context};
use crate::span::Span;
use crate::transport::ib::UserDevice;
use crate::{Op, P2p};

/// What the engine knows about moving its buffers in place.
#[derive(Debug, Default)]
struct State {
    /// For each rank, whether ib carries transfers with it (asked once).
    peers: Option<Vec<bool>>,
    /// Registered allocations: start -> (buffer id, the registered range).
    registered: HashMap<u64, (u64, Span)>,
    /// Why GPU memory cannot be registered with ib here; every operation stages then.
    refused: Option<String>,
    /// Allocations whose registration failed (start -> buffer id): their operations stage.
    failed: HashMap<u64, u64>,
    /// Operations that ran in place (diagnostics and tests).
    ran: u64,
}

/// The in-place path of one engine.
#[derive(Debug)]
pub(crate) struct Direct {
    /// The smallest operation moved in place; `None` when the path is off.
    min_bytes: Option<usize>,
    state: Mutex<State>,
}

// SAFETY: the spans are only compared and handed back to the communicator that registered
// them; nothing dereferences them.
unsafe impl Send for Direct {}
// SAFETY: as above; the state is behind a mutex.
unsafe impl Sync for Direct {}

impl Direct {
    pub(crate) fn new(comm: &Comm) -> Direct {
        let cfg = comm.config();
        Direct {
            min_bytes: cfg.ib_gpu_direct_min_bytes.filter(|_| cfg.want_ib),
            state: Mutex::new(State::default()),
        }
    }

    /// Whether `op` (over device buffers of `ctx`) runs in place: a send, receive or batch of
    /// them, large enough, with peers that ib carries, its buffers' allocations registered
    /// (now, if they were not). `false`: stage it.
    pub(crate) fn prepare(&self, op: &Op, comm: &Comm, ctx: &Arc<Context>) -> bool {
        let Some(min_bytes) = self.min_bytes else {
            return false;
        };
        let Some(transfers) = transfers(op) else {
            return false;
        };
        let bytes: usize = transfers.iter().map(|(_, s)| s.len()).sum();
        if bytes < min_bytes.max(1) || transfers.iter().any(|&(p, _)| p == comm.rank()) {
            return false;
        }
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.refused.is_some() {
            return false;
        }
        if st.peers.is_none() {
            if let Err(why) = crate::transport::ib::gpu_dmabuf_supported(ctx) {
                tracing::info!(
                    rank = comm.rank(),
                    "GPU buffers reach ib through host staging: {why}"
                );
                st.refused = Some(why);
                return false;
            }
            match comm.in_place_peers() {
                Ok(p) => st.peers = Some(p),
                Err(e) => {
                    tracing::debug!(rank = comm.rank(), "GPUDirect RDMA: {e}");
                    return false;
                }
            }
        }
        let peers = st.peers.as_deref().unwrap_or_default();
        if !transfers.iter().all(|&(p, _)| peers.get(p) == Some(&true)) {
            return false;
        }
        for &(_, span) in transfers.iter().filter(|(_, s)| !s.is_empty()) {
            if let Err(why) = register(&mut st, comm, ctx, span) {
                tracing::warn!(
                    rank = comm.rank(),
                    "{} reaches ib through host staging: {why}",
                    op.name()
                );
                return false;
            }
        }
        st.ran += 1;
        true
    }

    /// Operations that ran in place so far.
    pub(crate) fn ran(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).ran
    }

    /// Drops every registration (the engine stops; the allocations may be freed after).
    pub(crate) fn release(&self, comm: &Comm) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        for (_, (_, span)) in st.registered.drain() {
            comm.deregister_buffer(span);
        }
    }
}

/// The (peer, buffer) pairs of a send, receive or batch of them; `None` for other operations.
fn transfers(op: &Op) -> Option<Vec<(usize, Span)>> {
    match op {
        Op::Send { buf, peer } | Op::Recv { buf, peer } => Some(vec![(*peer, *buf)]),
        Op::Batch { ops } => Some(
            ops.iter()
                .map(|t| match *t {
                    P2p::Send { buf, peer } | P2p::Recv { buf, peer } => (peer, buf),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Registers the allocation holding `span` with ib, unless it is already (by start and id).
fn register(st: &mut State, comm: &Comm, ctx: &Arc<Context>, span: Span) -> Result<(), String> {
    let addr = span.addr() as u64;
    let (base, size, id) = ipc::allocation_of(ctx, addr)
        .map_err(|e| format!("finding the allocation of {span:?}: {e}"))?;
    if st.failed.get(&base) == Some(&id) {
        return Err(format!(
            "the allocation at {base:#x} could not be registered before"
        ));
    }
    match st.registered.get(&base) {
        Some(&(known, whole)) if known == id && whole.len() as u64 == size => return Ok(()),
        Some(&(_, stale)) => {
            // Freed and allocated again: the old registration names memory that is gone.
            comm.deregister_buffer(stale);
            st.registered.remove(&base);
        }
        None => {}
    }
    let len = usize::try_from(size).map_err(|_| format!("an allocation of {size} bytes"))?;
    // SAFETY: a device allocation: the NIC reaches it through its dma-buf, this process never
    // dereferences it.
    let whole = unsafe { Span::from_raw(base as *mut u8, len) };
    // SAFETY: the allocation stays registered until its start shows a new buffer id (it was
    // freed; the registration is dropped then) or the engine stops (`Direct::release`), and
    // the ib transport reads and writes it only for transfers naming it, which the caller's
    // tensors keep alive.
    match unsafe { comm.register_buffer(whole, UserDevice::Cuda(Arc::clone(ctx))) } {
        Ok(true) => {
            st.registered.insert(base, (id, whole));
            Ok(())
        }
        Ok(false) => Err("the communicator's transports cannot register memory".into()),
        Err(e) => {
            st.failed.insert(base, id);
            Err(e.to_string())
        }
    }
}
