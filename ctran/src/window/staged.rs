//! A window on GPU memory over host transports (sockets, shared memory): what a CUDA window
//! uses where the ranks' GPUs do not all reach each other over NVLink (across hosts, or several
//! ranks on one GPU).
//!
//! Peers' puts arrive as frames into pinned host staging of the window's size. The progress
//! thread only records, per peer, which bytes each put wrote and which signal covers them
//! ([`RegionSink`]); it makes no CUDA call, since a thread the device waits for must never
//! wait for the device (see [`crate::gpe`]). The bytes reach the GPU when the owner's wait for
//! the covering signal passes: the wait's host part lists the covered ranges in mapped memory,
//! and a kernel on the owner's stream, right behind the wait, copies exactly those ranges from
//! the staging (mapped into the GPU's address space) into the window. Only bytes peers put are
//! written: what the owner's kernels wrote into its window stays as they left it.
//!
//! The last reference to a sink may be dropped on the progress thread or the GPU progress
//! engine's (operations hold it), so its pinned memory is freed on a thread of its own.
//!
//! A list holds [`MAX_RANGES`] ranges after merging touching ones; a wait that covers more
//! fails with an error saying so. Lists are reused round robin over [`LIST_SLOTS`] waits, which
//! the stream order makes safe: a wait's host part runs only after every earlier wait's copy.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::cuda::{self, Context, PinnedBuffer};
use crate::gpe::DeviceLanding;
use crate::span::Span;
use crate::transport::RegionSink;

/// Ranges one wait can copy.
pub const MAX_RANGES: usize = 1024;
/// Lists per window, reused round robin.
pub const LIST_SLOTS: usize = 64;
/// Words of one list: the count, then (offset, length) pairs.
const SLOT_WORDS: usize = 1 + 2 * MAX_RANGES;

/// What one peer put and signalled, in arrival order.
#[derive(Debug, Default)]
struct PeerLedger {
    /// Ranges put since its last signal.
    open: Vec<(u64, u64)>,
    /// Ranges covered by a signal: (the signal's number, its ranges), oldest first.
    covered: VecDeque<(u64, Vec<(u64, u64)>)>,
    /// Signals applied so far.
    signals: u64,
}

#[derive(Debug)]
struct Ledger {
    peers: Vec<PeerLedger>,
    next_slot: usize,
}

impl Ledger {
    fn new(ranks: usize) -> Ledger {
        Ledger {
            peers: (0..ranks).map(|_| PeerLedger::default()).collect(),
            next_slot: 0,
        }
    }

    fn landed(&mut self, peer: usize, offset: u64, len: u64) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.open.push((offset, len));
        }
    }

    fn signalled(&mut self, peer: usize, add: u64) {
        if let Some(p) = self.peers.get_mut(peer) {
            p.signals += add;
            let open = std::mem::take(&mut p.open);
            if !open.is_empty() {
                p.covered.push_back((p.signals, open));
            }
        }
    }

    /// The ranges `peer` put before its signal number `target`, merged, and forgotten here.
    fn take(&mut self, peer: usize, target: u64) -> Vec<(u64, u64)> {
        let mut ranges = Vec::new();
        if let Some(p) = self.peers.get_mut(peer) {
            while p.covered.front().is_some_and(|(n, _)| *n <= target) {
                ranges.extend(p.covered.pop_front().expect("front exists").1);
            }
        }
        merge(ranges)
    }
}

/// The pinned memory of a sink.
#[derive(Debug)]
struct Buffers {
    staging: PinnedBuffer,
    lists: PinnedBuffer,
}

/// The staging of one window, the ledger of what peers put into it, and the lists its waits
/// hand to the device.
#[derive(Debug)]
pub struct DeviceSink {
    /// Taken only by `Drop`.
    buffers: Option<Buffers>,
    /// The window's device memory (as many bytes as the staging).
    device: u64,
    ledger: Mutex<Ledger>,
}

/// The list a wait fills and the copy its kernel makes.
#[derive(Debug, Clone)]
pub struct StagedWait {
    /// The window's sink.
    pub sink: Arc<DeviceSink>,
    /// The list the wait fills.
    pub slot: usize,
}

impl DeviceSink {
    /// Staging for `len` bytes of device memory at `device` on `ctx`'s GPU, for a communicator
    /// of `ranks` ranks. The memory must stay allocated while the sink lives (the window holds
    /// its owner as long).
    pub fn new(
        ctx: &Arc<Context>,
        device: u64,
        len: usize,
        ranks: usize,
    ) -> Result<DeviceSink, cuda::CudaError> {
        let buffers = Buffers {
            staging: PinnedBuffer::alloc(ctx, len)?,
            lists: PinnedBuffer::alloc(ctx, LIST_SLOTS * SLOT_WORDS * 8)?,
        };
        Ok(DeviceSink {
            buffers: Some(buffers),
            device,
            ledger: Mutex::new(Ledger::new(ranks)),
        })
    }

    fn buffers(&self) -> &Buffers {
        self.buffers
            .as_ref()
            .expect("present until the sink is dropped")
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The staging, where peers' puts land.
    pub fn staging(&self) -> Span {
        let staging = &self.buffers().staging;
        // SAFETY: the pinned buffer is valid for its length while the sink lives, and the
        // window that registers this span holds the sink until it is deregistered.
        unsafe { Span::from_raw(staging.as_ptr(), staging.len()) }
    }

    /// Reserves the list of the next wait, and the copy its kernel makes.
    pub fn next_wait(self: &Arc<Self>) -> (StagedWait, DeviceLanding) {
        let slot = {
            let mut l = self.ledger();
            let s = l.next_slot;
            l.next_slot = (s + 1) % LIST_SLOTS;
            s
        };
        let landing = DeviceLanding {
            list: self.buffers().lists.device_ptr() + (slot * SLOT_WORDS * 8) as u64,
            staging: self.buffers().staging.device_ptr(),
            window: self.device,
        };
        let wait = StagedWait {
            sink: Arc::clone(self),
            slot,
        };
        (wait, landing)
    }

    /// Fills list `slot` with the ranges `peer` put before its signal number `target` (the
    /// wait's), merged where they touch. Called once the wait's count is reached.
    pub fn fill(&self, slot: usize, peer: usize, target: u64) -> Result<(), String> {
        if slot >= LIST_SLOTS {
            return Err(format!("list {slot} of a window that has {LIST_SLOTS}"));
        }
        let merged = self.ledger().take(peer, target);
        if merged.len() > MAX_RANGES {
            return Err(format!(
                "peer {peer} put {} separate ranges into this CUDA window before the signal \
                 this wait consumes; a window over host transports lands at most {MAX_RANGES} \
                 per wait (signal more often, or put larger blocks)",
                merged.len()
            ));
        }
        let mut words = Vec::with_capacity(1 + 2 * merged.len());
        words.push(merged.len() as u64);
        for (off, len) in merged {
            words.extend([off, len]);
        }
        // SAFETY: slot < LIST_SLOTS, so the words lie inside the lists buffer; the device reads
        // this slot only after this wait's host part is done (its kernel follows the wait on
        // the stream), and no other wait uses the slot until then (stream order).
        unsafe {
            let dst = self.buffers().lists.as_ptr().add(slot * SLOT_WORDS * 8);
            let dst = dst.cast::<u64>();
            std::ptr::copy_nonoverlapping(words.as_ptr(), dst, words.len());
        }
        Ok(())
    }
}

/// The union of `ranges` as sorted, disjoint, non-touching ranges.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|&(_, len)| len > 0);
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (off, len) in ranges {
        match out.last_mut() {
            Some((o, l)) if off <= *o + *l => *l = (*l).max(off + len - *o),
            _ => out.push((off, len)),
        }
    }
    out
}

impl Drop for DeviceSink {
    /// Frees the pinned memory on a thread of its own (a CUDA call, which the progress
    /// threads must never make); here only if no thread can be started.
    fn drop(&mut self) {
        if let Some(b) = self.buffers.take() {
            let freeing = std::thread::Builder::new().name("ctran-window-free".into());
            if let Err(e) = freeing.spawn(move || drop(b)) {
                tracing::warn!(
                    "a staged window's pinned memory is leaked: no thread to free it ({e})"
                );
            }
        }
    }
}

impl RegionSink for DeviceSink {
    fn landed(&self, peer: usize, offset: usize, len: usize) {
        self.ledger().landed(peer, offset as u64, len as u64);
    }

    fn signalled(&self, peer: usize, add: u64) {
        self.ledger().signalled(peer, add);
    }
}

#[cfg(test)]
mod tests {
    use super::{merge, Ledger};

    #[test]
    fn a_wait_takes_the_puts_its_signal_covers_and_no_later_ones() {
        let mut l = Ledger::new(3);
        l.landed(1, 0, 8);
        l.landed(2, 64, 8);
        l.signalled(1, 1);
        l.landed(1, 8, 8); // after signal 1: covered by signal 2 only
        l.landed(1, 100, 4);
        l.signalled(1, 1);
        l.signalled(1, 1); // signal 3 covers nothing
        assert_eq!(l.take(1, 1), vec![(0, 8)]);
        assert_eq!(l.take(1, 1), Vec::<(u64, u64)>::new(), "taken once");
        assert_eq!(l.take(1, 3), vec![(8, 8), (100, 4)]);
        assert!(l.take(2, 5).is_empty(), "peer 2 signalled nothing yet");
        l.signalled(2, 1);
        assert_eq!(l.take(2, 1), vec![(64, 8)]);
        assert!(l.take(7, 1).is_empty(), "an unknown peer has nothing");
    }

    #[test]
    fn ranges_merge_where_they_touch_or_overlap() {
        assert_eq!(
            merge(vec![
                (100, 50),
                (0, 10),
                (10, 5),
                (120, 100),
                (300, 0),
                (400, 1)
            ]),
            vec![(0, 15), (100, 120), (400, 1)]
        );
        assert_eq!(merge(vec![(0, 100), (10, 5)]), vec![(0, 100)]);
        assert!(merge(Vec::new()).is_empty());
    }
}
