//! Where everything lives inside the segment. Every field that one rank writes and others poll
//! sits on its own 128-byte line (two 64-byte lines: adjacent-line prefetch would otherwise make
//! neighbours' flags share traffic).

use std::sync::atomic::{AtomicU32, AtomicU64};

/// Padding unit.
pub(crate) const LINE: usize = 128;
/// Written by the creator once the segment is initialised.
pub(crate) const MAGIC: u64 = 0x7463_7273_5348_4d32; // "tcrsSHM2"

/// Sizes chosen by configuration.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sizes {
    /// Ranks on this host.
    pub(crate) nlocal: usize,
    /// Slots per point-to-point FIFO.
    pub(crate) fifo_slots: usize,
    /// Payload bytes per FIFO slot.
    pub(crate) fifo_slot_bytes: usize,
    /// Bytes of one collective buffer (each rank has two per lane).
    pub(crate) coll_bytes: usize,
    /// Lanes of the shared-memory collectives: each has, per rank, its own control line,
    /// descriptors and collective buffers, so that one thread per lane runs a part of an
    /// operation without touching the others' state.
    pub(crate) lanes: usize,
}

/// Per-rank control line (one per lane; the fields about the process and point-to-point traffic
/// are used on lane 0 only, apart from `pid`, which every lane holds).
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Control {
    /// Bumped whenever something this rank may wait for happened; futex word.
    pub(crate) doorbell: AtomicU32,
    /// Non-zero while this rank sleeps (or is about to) on its doorbell.
    pub(crate) sleeping: AtomicU32,
    /// Collective arrival counter (see `sync`).
    pub(crate) arrived: AtomicU64,
    /// The rank's process id (diagnostics, and the target of cross-memory reads).
    pub(crate) pid: AtomicU32,
    /// Cross-memory attach probe: 0 not yet, 1 this rank read every peer, 2 it could not.
    pub(crate) cma_state: AtomicU32,
    /// Address of a word in this rank's memory that peers read to probe cross-memory attach.
    pub(crate) probe_addr: AtomicU64,
    /// The value that word holds.
    pub(crate) probe_value: AtomicU64,
    /// How far this rank got in the current cross-memory all_reduce: the operation's first
    /// barrier number in the top 24 bits, bytes of its slice reduced in the low 40.
    pub(crate) progress: AtomicU64,
    /// The collective this rank runs ([`crate::transport::OpTag::word`]), for peers that wait
    /// on it long to check they agree (see `Node::wait_for`).
    pub(crate) op_word: AtomicU64,
    /// Its sequence number ([`crate::transport::OpTag::seq`]).
    pub(crate) op_seq: AtomicU64,
}

/// What a rank publishes before the first barrier of a shared-memory collective: enough for
/// every peer to check that they agree on the operation, and the addresses of its buffers for
/// cross-memory reads. Two per rank, picked by the parity of the barrier they go with, so a fast
/// rank never overwrites one a slow rank may still read.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct OpDesc {
    /// The operation's sequence number on the communicator.
    pub(crate) seq: AtomicU64,
    /// Which collective (`collectives::Kind`).
    pub(crate) kind: AtomicU64,
    /// This rank's main size in bytes (what the error message names).
    pub(crate) bytes: AtomicU64,
    /// Hash of everything else ranks must agree on (dtype, reduce op, root, block sizes).
    pub(crate) args: AtomicU64,
}

/// One published buffer: address in the publishing process and length.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) addr: AtomicU64,
    pub(crate) len: AtomicU64,
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

/// Header written at the start of every FIFO slot: the message's length, this chunk's length,
/// and the sender's operation tag (two words).
pub(crate) const SLOT_HEADER: usize = 32;

/// Byte offsets of every region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub(crate) sizes: Sizes,
    controls: usize,
    fifo_index: usize,
    fifo_data: usize,
    descs: usize,
    desc_bytes: usize,
    coll: usize,
    pub(crate) total: usize,
    /// The lane whose control lines, descriptors and buffers the accessors below address.
    lane: usize,
}

impl Layout {
    pub(crate) fn new(sizes: Sizes) -> Layout {
        let n = sizes.nlocal;
        let lanes = sizes.lanes.max(1);
        let pairs = n * n.saturating_sub(1);
        let controls = LINE;
        let fifo_index = controls + lanes * n * LINE;
        let fifo_data = fifo_index + pairs * std::mem::size_of::<FifoIndex>();
        let slot = SLOT_HEADER + sizes.fifo_slot_bytes;
        let descs = fifo_data + pairs * sizes.fifo_slots * slot;
        // A descriptor, then one block per local rank (all_to_all and reduce_scatter publish one
        // buffer per destination).
        let desc_bytes = (std::mem::size_of::<OpDesc>() + n * std::mem::size_of::<Block>())
            .next_multiple_of(LINE);
        let coll = (descs + lanes * n * 2 * desc_bytes).next_multiple_of(4096);
        let total = coll + lanes * n * 2 * sizes.coll_bytes;
        Layout {
            sizes,
            controls,
            fifo_index,
            fifo_data,
            descs,
            desc_bytes,
            coll,
            total,
            lane: 0,
        }
    }

    /// The same layout, addressing lane `lane`'s control lines, descriptors and buffers.
    pub(crate) fn for_lane(&self, lane: usize) -> Layout {
        assert!(
            lane < self.sizes.lanes.max(1),
            "lane {lane} of {}",
            self.sizes.lanes
        );
        Layout { lane, ..*self }
    }

    /// Index of local rank `i`'s copy of a per-rank structure on this lane.
    fn slot_of(&self, i: usize) -> usize {
        self.lane * self.sizes.nlocal + i
    }

    /// Index of the FIFO from local rank `src` to local rank `dst` (`src != dst`).
    pub(crate) fn pair(&self, src: usize, dst: usize) -> usize {
        debug_assert_ne!(src, dst);
        src * (self.sizes.nlocal - 1) + if dst < src { dst } else { dst - 1 }
    }

    pub(crate) fn control(&self, i: usize) -> usize {
        self.controls + self.slot_of(i) * LINE
    }

    pub(crate) fn fifo_index(&self, pair: usize) -> usize {
        self.fifo_index + pair * std::mem::size_of::<FifoIndex>()
    }

    pub(crate) fn fifo_slot(&self, pair: usize, slot: usize) -> usize {
        let s = SLOT_HEADER + self.sizes.fifo_slot_bytes;
        self.fifo_data + (pair * self.sizes.fifo_slots + slot) * s
    }

    /// Descriptor `b` (0 or 1) of local rank `i`; its blocks follow it.
    pub(crate) fn desc(&self, i: usize, b: usize) -> usize {
        self.descs + (self.slot_of(i) * 2 + b) * self.desc_bytes
    }

    /// Block `j` of descriptor `b` of local rank `i`.
    pub(crate) fn block(&self, i: usize, b: usize, j: usize) -> usize {
        self.desc(i, b) + std::mem::size_of::<OpDesc>() + j * std::mem::size_of::<Block>()
    }

    /// Collective buffer `b` (0 or 1) of local rank `i`.
    pub(crate) fn coll(&self, i: usize, b: usize) -> usize {
        self.coll + (self.slot_of(i) * 2 + b) * self.sizes.coll_bytes
    }
}

const _: () = assert!(std::mem::size_of::<Control>() <= LINE);
const _: () = assert!(std::mem::size_of::<FifoIndex>() == 2 * LINE);
