//! What every shared-memory collective works through: [`ShmCtx`], its barriers, descriptor
//! checks, and waits that tell how long they last.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::span::Span;
use crate::transport::shm::cma;
use crate::transport::shm::node::{Node, WaitEnd};

use super::lane::Lane;
use crate::comm::stable_hash::StableHasher;
use crate::transport::TransportError;

use super::*;

/// What a shared-memory collective needs besides its buffers.
pub struct ShmCtx<'a> {
    /// The lane this part of the operation runs on (segment, counters).
    pub lane: &'a mut Lane,
    /// How many lanes share the operation (1: this lane runs all of it); sizes that choose a
    /// path are the whole operation's.
    pub parts: usize,
    /// The whole operation's size that decided the cut (0 when it is not cut): published with
    /// the arguments, so that ranks that cut an operation differently fail its first barrier.
    pub whole: usize,
    /// When to give up.
    pub deadline: Instant,
    /// The operation's sequence number (ranks check that they agree on it).
    pub seq: u64,
    /// Reports dead peers while waiting.
    pub alive: &'a mut dyn FnMut() -> Result<(), TransportError>,
    /// Told when this rank starts to wait for its peers ([`Waiting::Begins`], at the first
    /// poll that finds them not ready) and when a wait lasts ([`Waiting::Lasts`], after
    /// [`LONG_WAIT`]), in every wait. The progress thread does its trace's writing there,
    /// where it only waits anyway: the oldest of the earlier operations' unwritten records at
    /// the first, all of them and this operation's start at the second (a hang always waits
    /// that long, so a live dump shows it started; an operation whose peers are on time never
    /// does, and its record is written whole after it completed).
    pub waiting: &'a mut dyn FnMut(Waiting),
}

/// How far a wait of a shared-memory collective has gone (see [`ShmCtx::waiting`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The first poll found the peers not ready.
    Begins,
    /// The peers were not ready for [`LONG_WAIT`].
    Lasts,
}

/// How long a wait goes on before it counts as [`Waiting::Lasts`]: several times the whole
/// of a small operation whose peers are on time (3 to 8 us with 2 to 8 ranks on one host).
pub const LONG_WAIT: Duration = Duration::from_micros(50);

/// Polls of a wait before it reads the clock to see whether it lasts: a poll costs tens of
/// nanoseconds, a clock read as much.
const POLLS_BEFORE_CLOCK: u32 = 16;

/// [`Node::wait_for`](Node::wait_for) that tells `waiting` how far it has gone.
pub(super) fn wait_telling(
    node: &Node,
    waiting: &mut dyn FnMut(Waiting),
    mut done: impl FnMut(&Node) -> bool,
    deadline: Instant,
    alive: &mut dyn FnMut() -> Result<(), TransportError>,
) -> Result<(), WaitEnd> {
    let mut misses = 0u32;
    // When the wait counts as lasting (the clock is read from the 16th poll on).
    let mut lasts_at: Option<Instant> = None;
    let mut told_lasts = false;
    let telling = |n: &Node| {
        if done(n) {
            return true;
        }
        misses += 1;
        if misses == 1 {
            waiting(Waiting::Begins);
        } else if !told_lasts && misses >= POLLS_BEFORE_CLOCK {
            let at = *lasts_at.get_or_insert_with(|| Instant::now() + LONG_WAIT);
            if Instant::now() >= at {
                told_lasts = true;
                waiting(Waiting::Lasts);
            }
        }
        false
    };
    node.wait_for(telling, deadline, alive)
}

impl std::fmt::Debug for ShmCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCtx")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ShmCtx<'_> {
    pub(super) fn n(&self) -> usize {
        self.lane.node.nlocal()
    }

    pub(super) fn me(&self) -> usize {
        self.lane.node.me
    }

    /// The other local ranks, from the next one up and around: the order in which this rank
    /// reads them, so that at each step every rank reads a different peer's memory (in rank
    /// order all would read the same peer's, whose core then serves every reader at once).
    /// A reduction that combines in this order is still reduced in one fixed order per slice,
    /// by the one rank that owns it.
    pub(super) fn peers(&self) -> impl Iterator<Item = usize> {
        let (n, me) = (self.n(), self.me());
        (1..n).map(move |k| (me + k) % n)
    }

    /// The buffer of rank `i` for the current round.
    pub(super) fn buf(&self, i: usize) -> Span {
        self.lane.node.coll(i, (self.lane.coll_rounds % 2) as usize)
    }

    pub(super) fn capacity(&self) -> usize {
        self.lane.node.layout().sizes.coll_bytes
    }

    pub(super) fn next_round(&mut self) {
        self.lane.coll_rounds += 1;
    }

    /// Global rank of local rank `l`.
    pub(super) fn global(&self, l: usize) -> usize {
        self.lane.node.global[l]
    }

    /// Whether a message of `bytes` goes by cross-memory attach. Callers pass a size every rank
    /// agrees on (checked with the first barrier), so all take the same path.
    ///
    /// Only between two ranks: with more, several ranks read through one process's page
    /// tables at once (`process_vm_readv` pins every page it copies), and on a 16-core host
    /// copying through the shared buffers took 0.2-0.5 of the time for broadcast and
    /// all_gather and up to 0.65 for reduce_scatter at 4 and 8 ranks (0.5-0.85 for those on a
    /// 2-core host at 4 ranks). all_to_all, whose every block has a single reader, reads
    /// directly at any count; all_reduce decides with [`ShmCtx::cma_fits`].
    pub(super) fn use_cma(&self, bytes: usize) -> bool {
        self.n() == 2 && self.cma_fits(bytes)
    }

    /// Whether cross-memory attach is on and a message of `bytes` (this lane's share of it)
    /// is large enough for it, whatever the number of ranks.
    pub(super) fn cma_fits(&self, bytes: usize) -> bool {
        self.lane.cma && bytes.saturating_mul(self.parts) >= self.lane.cma_min_bytes.max(1)
    }

    /// Publishes `d` and `blocks` (buffers peers may read directly) with the next barrier.
    pub(super) fn publish(&mut self, d: Desc, blocks: &[Span]) {
        let b = ((self.lane.arrivals + 1) % 2) as usize;
        self.lane.published = b;
        let node = &self.lane.node;
        let desc = node.desc(node.me, b);
        desc.seq.store(self.seq, Ordering::Relaxed);
        desc.kind.store(d.kind as u64, Ordering::Relaxed);
        desc.bytes.store(d.bytes as u64, Ordering::Relaxed);
        desc.args.store(self.args(d), Ordering::Relaxed);
        for (j, s) in blocks.iter().enumerate() {
            let blk = node.block(node.me, b, j);
            blk.addr.store(s.addr() as u64, Ordering::Relaxed);
            blk.len.store(s.len() as u64, Ordering::Relaxed);
        }
    }

    /// The arguments word published for `d`: with the cut into lanes, when there is one.
    fn args(&self, d: Desc) -> u64 {
        if self.parts == 1 {
            return d.args;
        }
        StableHasher::new()
            .u64(d.args)
            .u64(self.parts as u64)
            .u64(self.whole as u64)
            .finish()
    }

    /// After the barrier that went with [`ShmCtx::publish`]: checks that every rank published
    /// the same operation, sequence number and arguments as this one, and that rank `j`'s size
    /// is `expect(j)`.
    pub(super) fn check(&self, d: Desc, expect: impl Fn(usize) -> usize) -> Result<(), ShmFail> {
        for j in (0..self.n()).filter(|&j| j != self.me()) {
            self.check_peer(d, j, expect(j))?;
        }
        Ok(())
    }

    /// [`ShmCtx::check`] for rank `j` alone, once it arrived where it published its descriptor.
    pub(super) fn check_peer(&self, d: Desc, j: usize, expect: usize) -> Result<(), ShmFail> {
        let p = self.lane.node.desc(j, self.lane.published);
        let (seq, kind) = (
            p.seq.load(Ordering::Relaxed),
            p.kind.load(Ordering::Relaxed),
        );
        let bytes = p.bytes.load(Ordering::Relaxed) as usize;
        let what = Kind::name(d.kind as u64);
        let detail = if seq != self.seq || kind != d.kind as u64 {
            format!(
                "this rank runs {what} (seq {}) while the peer runs {} (seq {seq}) \
                 over shared memory",
                self.seq,
                Kind::name(kind)
            )
        } else if bytes != expect {
            format!(
                "{what} sizes disagree: this rank expects {expect} bytes from the peer, \
                 the peer has {bytes}"
            )
        } else if p.args.load(Ordering::Relaxed) != self.args(d) {
            format!(
                "{what} arguments disagree (element type, reduce op, root, block sizes, or \
                 the whole operation's size when it is cut into lanes)"
            )
        } else {
            return Ok(());
        };
        Err(ShmFail::Mismatch {
            peer: self.global(j),
            detail,
        })
    }

    /// The size local rank `j` published with the last barrier.
    pub(super) fn peer_bytes(&self, j: usize) -> usize {
        let p = self.lane.node.desc(j, self.lane.published);
        p.bytes.load(Ordering::Relaxed) as usize
    }

    /// Block `k` that local rank `j` published for this operation: (address, length).
    pub(super) fn peer_block(&self, j: usize, k: usize) -> (usize, usize) {
        let b = self.lane.published;
        let blk = self.lane.node.block(j, b, k);
        (
            blk.addr.load(Ordering::Relaxed) as usize,
            blk.len.load(Ordering::Relaxed) as usize,
        )
    }

    /// Copies `local.len()` bytes from `offset` into block `k` of local rank `j` (published
    /// with the last barrier and checked to be long enough).
    pub(super) fn read(
        &mut self,
        j: usize,
        k: usize,
        offset: usize,
        local: Span,
    ) -> Result<(), ShmFail> {
        let (addr, len) = self.peer_block(j, k);
        if offset + local.len() > len {
            return Err(ShmFail::Mismatch {
                peer: self.global(j),
                detail: format!(
                    "the peer's buffer has {len} bytes, this rank needs {} from offset {offset}",
                    local.len()
                ),
            });
        }
        let pid = self.lane.node.control(j).pid.load(Ordering::Relaxed);
        cma::read(pid, addr + offset, local)
            .map(|()| cma::count(local.len()))
            .map_err(|e| {
                // A peer that died is the likely cause; its closed connection says so for sure.
                let cause = (self.alive)().err();
                ShmFail::Peer(cause.unwrap_or_else(|| TransportError::PeerLost {
                    peer: self.global(j),
                    reason: format!("cross-memory read of its buffer failed: {e}"),
                }))
            })
    }

    /// Announces this rank's arrival and waits for everyone's.
    pub(super) fn barrier(&mut self) -> Result<(), ShmFail> {
        let target = self.arrive();
        let all_in = |n: &Node| {
            (0..n.nlocal()).all(|i| n.control(i).arrived.load(Ordering::Acquire) >= target)
        };
        self.wait_until(all_in, |n| {
            (0..n.nlocal()).find(|&i| n.control(i).arrived.load(Ordering::Acquire) < target)
        })
    }

    /// Announces this rank's arrival at its next barrier without waiting for the others, and
    /// returns the barrier's number: peers then wait for this rank alone
    /// ([`ShmCtx::arrived`], [`ShmCtx::wait_arrived`]).
    pub(super) fn arrive(&mut self) -> u64 {
        self.lane.arrivals += 1;
        let target = self.lane.arrivals;
        let node = &self.lane.node;
        node.control(node.me)
            .arrived
            .store(target, Ordering::Release);
        node.ring_others();
        target
    }

    /// Whether local rank `j` arrived at barrier `target`.
    pub(super) fn arrived(&self, j: usize, target: u64) -> bool {
        self.lane.node.control(j).arrived.load(Ordering::Acquire) >= target
    }

    /// Waits until local rank `j` arrived at barrier `target`.
    pub(super) fn wait_arrived(&mut self, j: usize, target: u64) -> Result<(), ShmFail> {
        let done = move |n: &Node| n.control(j).arrived.load(Ordering::Acquire) >= target;
        self.wait_until(done, |_| Some(j))
    }

    /// Waits until `done` holds; past the deadline, `late` names the (local) rank waited for.
    pub(super) fn wait_until(
        &mut self,
        done: impl FnMut(&Node) -> bool,
        late: impl Fn(&Node) -> Option<usize>,
    ) -> Result<(), ShmFail> {
        let node = &self.lane.node;
        match wait_telling(node, self.waiting, done, self.deadline, self.alive) {
            Ok(()) => Ok(()),
            Err(WaitEnd::Failed(e)) => Err(ShmFail::Peer(e)),
            Err(WaitEnd::Deadline) => Err(ShmFail::Deadline {
                waiting_for: late(node).map(|l| self.global(l)),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::shm::layout::Sizes;

    pub(super) fn one_rank_node() -> Node {
        let sizes = Sizes {
            nlocal: 1,
            fifo_slots: 2,
            fifo_slot_bytes: 64,
            coll_bytes: 64,
            lanes: 1,
        };
        let name = format!(
            "/tc-wait-test-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        Node::attach(
            &name,
            sizes,
            0,
            Duration::from_millis(1),
            deadline,
            &mut || Ok(()),
        )
        .unwrap()
    }

    #[test]
    pub(super) fn a_wait_tells_when_it_begins_and_when_it_lasts() {
        let node = one_rank_node();
        let deadline = Instant::now() + Duration::from_secs(5);
        let t0 = Instant::now();
        let told = std::cell::RefCell::new(Vec::new());
        // Ready only once the wait was told it lasts (a preempted thread may see any time pass
        // between two polls, so readiness by elapsed time alone could skip `Lasts`).
        wait_telling(
            &node,
            &mut |w| told.borrow_mut().push((w, t0.elapsed())),
            |_| told.borrow().iter().any(|(w, _)| *w == Waiting::Lasts),
            deadline,
            &mut || Ok(()),
        )
        .unwrap();
        let mut told = told.into_inner();
        let kinds: Vec<Waiting> = told.iter().map(|(w, _)| *w).collect();
        assert_eq!(kinds, [Waiting::Begins, Waiting::Lasts], "once each");
        assert!(told[1].1 >= LONG_WAIT, "{told:?}");

        // Ready at once: nothing to tell (the trace writes nothing on the path).
        told.clear();
        let t0 = Instant::now();
        let mut polls = 0;
        wait_telling(
            &node,
            &mut |w| told.push((w, t0.elapsed())),
            |_| {
                polls += 1;
                true
            },
            deadline,
            &mut || Ok(()),
        )
        .unwrap();
        assert_eq!((told.len(), polls), (0, 1));
    }
}
