//! The ranks of one host and the segment they share: typed views of the layout, doorbells, and
//! the wait loop (spin briefly, then sleep on a futex, checking the deadline and peer liveness).

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::futex;
use super::layout::{Block, Control, FifoIndex, Layout, OpDesc, Sizes, MAGIC};
use super::segment::Segment;
use crate::error::{Error, Result};
use crate::span::Span;
use crate::transport::{OpTag, TransportError, AGREEMENT_CHECK_AFTER};

/// Reports a local peer that died (its connection closed) while this rank waits for it.
pub(crate) type Alive<'a> = &'a mut dyn FnMut() -> std::result::Result<(), TransportError>;

/// What a wait ended with, when it did not succeed.
#[derive(Debug)]
pub(crate) enum WaitEnd {
    /// The deadline passed.
    Deadline,
    /// The liveness check reported a failure.
    Failed(TransportError),
}

/// One FIFO slot: its header words and its payload.
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    /// The whole message's length.
    pub(crate) msg_len: &'a AtomicU64,
    /// This chunk's length.
    pub(crate) chunk_len: &'a AtomicU64,
    /// The sender's operation tag ([`crate::transport::OpTag`]).
    pub(crate) tag_word: &'a AtomicU64,
    /// Its sequence number.
    pub(crate) tag_seq: &'a AtomicU64,
    /// The chunk's bytes.
    pub(crate) payload: Span,
}

/// This rank's view of the host's shared segment, on one lane (see [`Sizes::lanes`]).
#[derive(Debug)]
pub(crate) struct Node {
    seg: Arc<Segment>,
    layout: Layout,
    /// This rank's index among the host's ranks.
    pub(crate) me: usize,
    spin: Duration,
    /// The communicator rank of each local index (for errors that name a peer).
    pub(crate) global: Vec<usize>,
}

impl Node {
    /// Creates (local index 0) or opens the segment `name` and waits until it is initialised.
    /// The creator unlinks the name once every local rank has mapped it. `alive` reports a
    /// local peer that died meanwhile (its connection closed), so set-up fails in moments, not
    /// at the deadline; on any failure the name is unlinked here, so a creator that died after
    /// creating it leaves nothing in /dev/shm.
    pub(crate) fn attach(
        name: &str,
        sizes: Sizes,
        me: usize,
        spin: Duration,
        deadline: Instant,
        alive: Alive<'_>,
    ) -> Result<Node> {
        let attached = Self::attach_watching(name, sizes, me, spin, deadline, alive);
        if attached.is_err() {
            Segment::unlink_name(name);
        }
        attached
    }

    fn attach_watching(
        name: &str,
        sizes: Sizes,
        me: usize,
        spin: Duration,
        deadline: Instant,
        alive: Alive<'_>,
    ) -> Result<Node> {
        let layout = Layout::new(sizes);
        let seg = if me == 0 {
            Segment::create(name, layout.total)?
        } else {
            Segment::open(name, layout.total, deadline, &mut *alive)?
        };
        let mut node = Node {
            seg: Arc::new(seg),
            layout,
            me,
            spin,
            global: Vec::new(),
        };
        let failed = |what: String, end: WaitEnd| Error::Bootstrap {
            comm: String::new(),
            reason: match end {
                WaitEnd::Deadline => format!("{what} before the deadline"),
                WaitEnd::Failed(e) => format!("{what}: {e}"),
            },
        };
        if me == 0 {
            node.header_word(3)
                .store(sizes.lanes as u64, Ordering::Relaxed);
            node.header_word(0).store(MAGIC, Ordering::Release);
        } else {
            node.wait_for(
                |n| n.header_word(0).load(Ordering::Acquire) == MAGIC,
                deadline,
                &mut *alive,
            )
            .map_err(|e| failed(format!("segment {name} was not initialised"), e))?;
            let theirs = node.header_word(3).load(Ordering::Relaxed);
            if theirs != sizes.lanes as u64 {
                return Err(Error::Bootstrap {
                    comm: String::new(),
                    reason: format!(
                        "local rank 0 runs shared-memory collectives on {theirs} lanes, this \
                         rank on {}: set CTRAN_SHM_LANES alike on every rank of the host",
                        sizes.lanes
                    ),
                });
            }
        }
        for lane in 0..sizes.lanes.max(1) {
            node.lane(lane)
                .control(me)
                .pid
                .store(std::process::id(), Ordering::Relaxed);
        }
        node.header_word(1).fetch_add(1, Ordering::AcqRel);
        if me != 0 {
            node.ring(0);
        }
        if me == 0 {
            // Unlink as soon as everyone mapped it: a killed rank can then leave nothing behind.
            let result = node.wait_for(
                |n| n.header_word(1).load(Ordering::Acquire) as usize == sizes.nlocal,
                deadline,
                &mut *alive,
            );
            Arc::get_mut(&mut node.seg)
                .expect("no lane view exists during set-up")
                .unlink();
            result.map_err(|e| {
                failed(
                    format!("not every local rank attached to shared memory segment {name}"),
                    e,
                )
            })?;
        }
        Ok(node)
    }

    fn word<T>(&self, offset: usize) -> &T {
        debug_assert!(offset + std::mem::size_of::<T>() <= self.seg.len());
        debug_assert_eq!(offset % std::mem::align_of::<T>(), 0);
        // SAFETY: the offset lies inside the mapping (layout arithmetic), is aligned, and the
        // types used here (atomics and structs of atomics) are valid for any bit pattern,
        // including the zeroes a fresh segment holds. The mapping lives as long as `self`.
        unsafe { &*self.seg.base().as_ptr().add(offset).cast::<T>() }
    }

    /// The same segment seen on lane `lane`: its control lines, descriptors and collective
    /// buffers (the header and the point-to-point FIFOs are shared by every lane).
    pub(crate) fn lane(&self, lane: usize) -> Node {
        Node {
            seg: Arc::clone(&self.seg),
            layout: self.layout.for_lane(lane),
            me: self.me,
            spin: self.spin,
            global: self.global.clone(),
        }
    }

    fn header_word(&self, i: usize) -> &AtomicU64 {
        self.word(i * 8)
    }

    /// Number of ranks on this host.
    pub(crate) fn nlocal(&self) -> usize {
        self.layout.sizes.nlocal
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    pub(crate) fn control(&self, i: usize) -> &Control {
        self.word(self.layout.control(i))
    }

    /// Descriptor `b` (0 or 1) of local rank `i`.
    pub(crate) fn desc(&self, i: usize, b: usize) -> &OpDesc {
        self.word(self.layout.desc(i, b))
    }

    /// Block `j` of descriptor `b` of local rank `i`.
    pub(crate) fn block(&self, i: usize, b: usize, j: usize) -> &Block {
        self.word(self.layout.block(i, b, j))
    }

    /// Shared header word `i` (0: magic, 1: ranks attached, 2: ranks that published their
    /// cross-memory probe, 3: lanes).
    pub(crate) fn header(&self, i: usize) -> &AtomicU64 {
        self.header_word(i)
    }

    pub(crate) fn fifo(&self, pair: usize) -> &FifoIndex {
        self.word(self.layout.fifo_index(pair))
    }

    fn span_at(&self, offset: usize, len: usize) -> Span {
        assert!(offset + len <= self.seg.len());
        // SAFETY: inside the mapping, which outlives every span handed out (the node holds it and
        // spans are used only while the node is alive, by the thread that owns this lane's
        // view; lanes address disjoint buffers).
        unsafe { Span::from_raw(self.seg.base().as_ptr().add(offset), len) }
    }

    /// FIFO slot `slot` of `pair`: header then payload.
    pub(crate) fn fifo_slot(&self, pair: usize, slot: usize) -> Slot<'_> {
        let off = self.layout.fifo_slot(pair, slot);
        Slot {
            msg_len: self.word(off),
            chunk_len: self.word(off + 8),
            tag_word: self.word(off + 16),
            tag_seq: self.word(off + 24),
            payload: self.span_at(
                off + super::layout::SLOT_HEADER,
                self.layout.sizes.fifo_slot_bytes,
            ),
        }
    }

    /// Collective buffer `b` of local rank `i`.
    pub(crate) fn coll(&self, i: usize, b: usize) -> Span {
        self.span_at(self.layout.coll(i, b), self.layout.sizes.coll_bytes)
    }

    /// Tells local rank `i` that something it may wait for happened, for an event that the
    /// condition of its wait ([`Node::wait_for`]) observes, made visible before this call.
    ///
    /// Only a sleeping rank's doorbell is bumped: a spinning one sees the event in its next
    /// poll. The doorbell shares the line of the rank's control words that every peer polls,
    /// so bumping it on every event (an atomic read-modify-write from each of the other ranks
    /// at every barrier) moved that line through every core's cache several times per barrier.
    pub(crate) fn ring(&self, i: usize) {
        // Pairs with the fence in `wait_for` between announcing the sleep and re-checking the
        // condition: either the waiter's check sees the event, or this load sees it sleeping.
        fence(Ordering::SeqCst);
        self.wake_if_sleeping(i);
    }

    /// Rings every other local rank (one fence for all).
    pub(crate) fn ring_others(&self) {
        fence(Ordering::SeqCst);
        for i in (0..self.nlocal()).filter(|&i| i != self.me) {
            self.wake_if_sleeping(i);
        }
    }

    fn wake_if_sleeping(&self, i: usize) {
        let c = self.control(i);
        if c.sleeping.load(Ordering::Relaxed) != 0 {
            c.doorbell.fetch_add(1, Ordering::SeqCst);
            futex::wake_all(&c.doorbell);
        }
    }

    /// Wakes local rank `i` for an event its wait's condition does not observe (a flag that
    /// only its liveness check reads): bumps its doorbell whether it sleeps or not, so that a
    /// sleep about to start returns at once.
    pub(crate) fn wake(&self, i: usize) {
        let c = self.control(i);
        c.doorbell.fetch_add(1, Ordering::SeqCst);
        if c.sleeping.load(Ordering::SeqCst) != 0 {
            futex::wake_all(&c.doorbell);
        }
    }

    fn my_bell(&self) -> &AtomicU32 {
        &self.control(self.me).doorbell
    }

    /// Publishes the collective this rank starts, for the agreement check of waiting peers.
    pub(crate) fn publish_op(&self, tag: OpTag) {
        let me = self.control(self.me);
        me.op_word.store(tag.word, Ordering::Relaxed);
        me.op_seq.store(tag.seq, Ordering::Release);
    }

    /// Fails when a local peer runs another collective with this rank's sequence number: they
    /// wait for each other in operations that will never meet.
    pub(crate) fn check_agreement(&self) -> std::result::Result<(), TransportError> {
        let mine = self.control(self.me);
        let expected = OpTag {
            word: mine.op_word.load(Ordering::Relaxed),
            seq: mine.op_seq.load(Ordering::Relaxed),
        };
        if expected.seq == 0 {
            return Ok(());
        }
        for l in (0..self.nlocal()).filter(|&l| l != self.me) {
            let c = self.control(l);
            let seq = c.op_seq.load(Ordering::Acquire);
            let got = OpTag {
                word: c.op_word.load(Ordering::Relaxed),
                seq,
            };
            // A peer between two stores shows a new word with an old sequence: read again.
            if seq == expected.seq
                && got.word != expected.word
                && c.op_seq.load(Ordering::Acquire) == seq
            {
                return Err(TransportError::Disagree {
                    peer: self.global.get(l).copied().unwrap_or(l),
                    expected,
                    got,
                });
            }
        }
        Ok(())
    }

    /// Waits until `done` holds, spinning first, then sleeping on this rank's doorbell; calls
    /// `alive` every few milliseconds while sleeping so a dead peer ends the wait.
    pub(crate) fn wait_for(
        &self,
        mut done: impl FnMut(&Node) -> bool,
        deadline: Instant,
        alive: &mut dyn FnMut() -> std::result::Result<(), crate::transport::TransportError>,
    ) -> std::result::Result<(), WaitEnd> {
        let started = Instant::now();
        let spin_until = started + self.spin;
        let mut spins = 0u32;
        loop {
            if done(self) {
                return Ok(());
            }
            let now = Instant::now();
            // Before spinning: a deadline already past asks for one look only.
            if now >= deadline {
                return Err(WaitEnd::Deadline);
            }
            if now < spin_until {
                spins += 1;
                if spins % 64 == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            alive().map_err(WaitEnd::Failed)?;
            if now.duration_since(started) >= AGREEMENT_CHECK_AFTER {
                self.check_agreement().map_err(WaitEnd::Failed)?;
            }
            let bell = self.my_bell().load(Ordering::SeqCst);
            let me = self.control(self.me);
            me.sleeping.store(1, Ordering::SeqCst);
            // Pairs with the fence in `ring`: a peer that made `done` true either is seen
            // below or sees this rank sleeping and bumps the doorbell.
            fence(Ordering::SeqCst);
            if !done(self) {
                let nap = (deadline - now).min(Duration::from_millis(5));
                futex::wait(self.my_bell(), bell, nap);
            }
            me.sleeping.store(0, Ordering::SeqCst);
        }
    }
}
