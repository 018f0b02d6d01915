//! Where everything lives inside the segment. Every field that one rank writes and others poll
//! sits on its own 128-byte line (two 64-byte lines: adjacent-line prefetch would otherwise make
//! neighbours' flags share traffic).

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Padding unit.
pub(crate) const LINE: usize = 128;
/// Written by the creator once the segment is initialised.
pub(crate) const MAGIC: u64 = 0x7463_7273_5348_4d31; // "tcrsSHM1"

/// Sizes chosen by configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// Ranks on this host.
    pub(crate) nlocal: usize,
    /// Slots per point-to-point FIFO.
    pub(crate) fifo_slots: usize,
    /// Payload bytes per FIFO slot.
    pub(crate) fifo_slot_bytes: usize,
    /// Bytes of one collective buffer (each rank has two).
    pub(crate) coll_bytes: usize,
}

/// Per-rank control line.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Control {
    /// Bumped whenever something this rank may wait for happened; futex word.
    pub(crate) doorbell: AtomicU32,
    /// Non-zero while this rank sleeps (or is about to) on its doorbell.
    pub(crate) sleeping: AtomicU32,
    /// Collective arrival counter (see `sync`).
    pub(crate) arrived: AtomicU64,
    /// The rank's process id (diagnostics).
    pub(crate) pid: AtomicU32,
}

/// Head and tail of one single-producer single-consumer FIFO, each on its own line.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct FifoIndex {
    /// Slots written by the producer.
    pub(crate) head: AtomicU64,
    _pad: [u8; LINE - 8],
    /// Slots consumed by the consumer.
    pub(crate) tail: AtomicU64,
    _pad2: [u8; LINE - 8],
}

/// Header written at the start of every FIFO slot.
pub(crate) const SLOT_HEADER: usize = 16;

/// Byte offsets of every region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) sizes: Sizes,
    controls: usize,
    fifo_index: usize,
    fifo_data: usize,
    coll: usize,
    pub(crate) total: usize,
}

impl Layout {
    pub(crate) fn new(sizes: Sizes) -> Layout {
        let n = sizes.nlocal;
        let pairs = n * n.saturating_sub(1);
        let controls = LINE;
        let fifo_index = controls + n * LINE;
        let fifo_data = fifo_index + pairs * std::mem::size_of::<FifoIndex>();
        let slot = SLOT_HEADER + sizes.fifo_slot_bytes;
        let coll = (fifo_data + pairs * sizes.fifo_slots * slot).next_multiple_of(4096);
        let total = coll + n * 2 * sizes.coll_bytes;
        Layout {
            sizes,
            controls,
            fifo_index,
            fifo_data,
            coll,
            total,
        }
    }

    /// Index of the FIFO from local rank `src` to local rank `dst` (`src != dst`).
    pub(crate) fn pair(&self, src: usize, dst: usize) -> usize {
        debug_assert_ne!(src, dst);
        src * (self.sizes.nlocal - 1) + if dst < src { dst } else { dst - 1 }
    }

    pub(crate) fn control(&self, i: usize) -> usize {
        self.controls + i * LINE
    }

    pub(crate) fn fifo_index(&self, pair: usize) -> usize {
        self.fifo_index + pair * std::mem::size_of::<FifoIndex>()
    }

    pub(crate) fn fifo_slot(&self, pair: usize, slot: usize) -> usize {
        let s = SLOT_HEADER + self.sizes.fifo_slot_bytes;
        self.fifo_data + (pair * self.sizes.fifo_slots + slot) * s
    }

    /// Collective buffer `b` (0 or 1) of local rank `i`.
    pub(crate) fn coll(&self, i: usize, b: usize) -> usize {
        self.coll + (i * 2 + b) * self.sizes.coll_bytes
    }
}

const _: () = assert!(std::mem::size_of::<Control>() <= LINE);
const _: () = assert!(std::mem::size_of::<FifoIndex>() == 2 * LINE);
