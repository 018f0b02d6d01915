//! A region of device memory every rank allocates and, where every pair of ranks can, every
//! rank maps from every peer (CUDA IPC: GPUs of one host that reach each other, or ranks
//! sharing one GPU). Kernels then write peers' regions directly.

use std::sync::Arc;

use crate::comm::Comm;
use crate::cuda::ipc::{self, Mapped, HANDLE_BYTES};
use crate::cuda::{Context, DeviceBuffer};
use crate::error::Result;
use crate::gpe::cuda_err;

/// Most ranks a region's peer table holds.
pub const MAX_RANKS: usize = 64;

/// Bytes of a card: host, device bus id, handle.
const CARD_BYTES: usize = 8 + 32 + HANDLE_BYTES;

/// This rank's region and, when mapped, every peer's.
#[derive(Debug)]
pub struct SymmetricRegion {
    local: DeviceBuffer,
    /// Every rank's region as mapped here (this rank's own at its index); only this rank's
    /// when not mapped.
    peer: [u64; MAX_RANKS],
    mapped: bool,
    _peers: Vec<Mapped>,
}

impl SymmetricRegion {
    /// Allocates `bytes` of zeroed memory on `ctx`'s device and maps every peer's when every
    /// rank can (then all do; the ranks agree). Collective over `comm`. `want_mapped` false (or
    /// `nvl` missing from `CTRAN_BACKENDS`) keeps every rank unmapped.
    pub fn new(comm: &Comm, ctx: &Arc<Context>, bytes: usize, want_mapped: bool) -> Result<Self> {
        let rank = comm.rank();
        let e = |x| cuda_err("symmetric memory", rank, x);
        let local = DeviceBuffer::zeroed(ctx, bytes.max(16)).map_err(e)?;
        let out = ipc::export(ctx, local.as_ptr()).map_err(e)?;
        let bus = ipc::pci_bus_id(ctx).map_err(e)?;
        let mut card = Vec::with_capacity(CARD_BYTES);
        card.extend_from_slice(&crate::comm::host_id().to_le_bytes());
        let mut busb = [0u8; 32];
        let n = bus.len().min(31);
        busb[..n].copy_from_slice(&bus.as_bytes()[..n]);
        card.extend_from_slice(&busb);
        card.extend_from_slice(&out.handle);
        let cards = comm.all_gather_bytes(&card, None)?;
        let mut ok = want_mapped && comm.config().use_nvl && comm.size() <= MAX_RANKS;
        let mut peer = [0u64; MAX_RANKS];
        let mut peers = Vec::new();
        for (q, c) in cards.chunks_exact(CARD_BYTES).enumerate() {
            if !ok || q == rank {
                continue;
            }
            let bus_q = String::from_utf8_lossy(&c[8..40])
                .trim_end_matches('\0')
                .to_string();
            let reach = c[..8] == card[..8]
                && (bus_q.eq_ignore_ascii_case(&bus)
                    || ipc::can_access(ctx, &bus_q).unwrap_or(false));
            let mut h = [0u8; HANDLE_BYTES];
            h.copy_from_slice(&c[40..]);
            match reach.then(|| Mapped::open(ctx, &h)) {
                Some(Ok(m)) => {
                    peer[q] = m.ptr();
                    peers.push(m);
                }
                Some(Err(err)) => {
                    tracing::info!(
                        rank,
                        peer = q,
                        "symmetric memory: mapping the peer's: {err}"
                    );
                    ok = false;
                }
                None => ok = false,
            }
        }
        let verdicts = comm.all_gather_bytes(&[u8::from(ok)], None)?;
        let mapped = !verdicts.contains(&0);
        if !mapped {
            peers.clear();
            peer = [0; MAX_RANKS];
        }
        peer[rank] = local.as_ptr();
        Ok(SymmetricRegion {
            local,
            peer,
            mapped,
            _peers: peers,
        })
    }

    /// Whether every rank's region is mapped here.
    pub fn is_mapped(&self) -> bool {
        self.mapped
    }

    /// This rank's region.
    pub fn local(&self) -> u64 {
        self.local.as_ptr()
    }

    /// Every rank's region as mapped here (zeros for peers when not mapped).
    pub fn peers(&self) -> [u64; MAX_RANKS] {
        self.peer
    }
}
