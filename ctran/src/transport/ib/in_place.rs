//! Buffers registered with the NIC for the communicator's own transfers (the GPU progress
//! engine's pinned staging; device memory where GPUDirect RDMA is allowed): a send from such a
//! buffer is written from it directly, and a receive into one is written by the peer directly,
//! without the transport's staging copies. Everything else stages as before.
//!
//! A registration is shared with the transfers that use it, so deregistering while one is in
//! flight leaves that transfer's memory registered until it completes.
//!
//! Unlike a staged receive, a receive in place that fails (a disagreement with another peer)
//! can still be written by its peer until the communicator's abort reaches that peer: the
//! peer holds the buffer's key. The operation has failed and the communicator is aborted, so
//! the buffer's contents are unspecified, as after any abort.

use std::sync::Arc;

use ibverbx::{LocalKey, RemoteKey as IbKey};

use super::user_memory::NicRegion;
use crate::span::Span;

/// A registered buffer a transfer writes from or into.
#[derive(Debug)]
pub(crate) struct Slice<U> {
    region: Arc<U>,
    /// Where the transfer's bytes start in the region.
    offset: u64,
}

impl<U: NicRegion> Slice<U> {
    pub(crate) fn local_key(&self) -> LocalKey {
        self.region.local_key()
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The key a peer writes `len` bytes of this slice with.
    pub(crate) fn remote_key(&self, len: u64) -> IbKey {
        let whole = self.region.remote_key();
        IbKey {
            addr: whole.addr + self.offset,
            len,
            rkey: whole.rkey,
        }
    }
}

/// The registered buffers, by address.
#[derive(Debug)]
pub(crate) struct InPlace<U> {
    regions: Vec<(u64, usize, Arc<U>)>,
    /// Transfers that moved in place (sends written from a registered buffer plus receives
    /// written into one): what tests and diagnostics count.
    pub(crate) moved: u64,
}

impl<U: NicRegion> InPlace<U> {
    pub(crate) fn new() -> InPlace<U> {
        InPlace {
            regions: Vec::new(),
            moved: 0,
        }
    }

    /// Whether `span` overlaps a registered buffer (registering it again is refused).
    pub(crate) fn overlaps(&self, span: Span) -> bool {
        let (a, n) = (span.addr() as u64, span.len() as u64);
        self.regions
            .iter()
            .any(|&(b, m, _)| a < b + m as u64 && b < a + n)
    }

    pub(crate) fn insert(&mut self, span: Span, region: U) {
        self.regions
            .push((span.addr() as u64, span.len(), Arc::new(region)));
    }

    /// Forgets the registration of exactly `span`; whether there was one.
    pub(crate) fn remove(&mut self, span: Span) -> bool {
        let before = self.regions.len();
        self.regions
            .retain(|&(b, m, _)| (b, m) != (span.addr() as u64, span.len()));
        self.regions.len() != before
    }

    /// The registered buffer holding all of `span` (not empty), counted as a transfer in place.
    pub(crate) fn slice(&mut self, span: Span) -> Option<Slice<U>> {
        if span.is_empty() {
            return None;
        }
        let (a, n) = (span.addr() as u64, span.len() as u64);
        let (base, _, region) = self
            .regions
            .iter()
            .find(|&&(b, m, _)| b <= a && a + n <= b + m as u64)?;
        self.moved += 1;
        Some(Slice {
            region: Arc::clone(region),
            offset: a - base,
        })
    }
}
