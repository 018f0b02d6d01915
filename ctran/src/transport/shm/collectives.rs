//! Collectives that read peers' shared-memory buffers directly, for communicators whose ranks
//! all share one host. Each rank owns two collective buffers; successive rounds alternate
//! between them, so a rank can fill round `k+1` while slower peers still read round `k`, and one
//! arrival barrier per round (two for all_reduce) is all the synchronisation needed.
//!
//! all_reduce: every rank copies its chunk in (prescaled), then reduces one slice of the chunk
//! straight from every peer's buffer in rank order, then copies every reduced slice out. Each
//! slice is reduced by exactly one rank, so all ranks end with bitwise the same result.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::node::WaitEnd;
use super::ShmTransport;
use crate::algos::ctx::{chunks, combine, finish, load_input, partition};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::TransportError;

/// Why a shared-memory collective stopped.
#[derive(Debug)]
pub enum ShmFail {
    /// The deadline passed while waiting for `waiting_for`.
    Deadline {
        /// The first rank that had not arrived.
        waiting_for: Option<usize>,
    },
    /// A peer failed.
    Peer(TransportError),
}

/// What a shared-memory collective needs besides its buffers.
pub struct ShmCtx<'a> {
    /// The transport (segment, counters).
    pub shm: &'a mut ShmTransport,
    /// When to give up.
    pub deadline: Instant,
    /// Reports dead peers while waiting.
    pub alive: &'a mut dyn FnMut() -> Result<(), TransportError>,
}

impl std::fmt::Debug for ShmCtx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmCtx")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl ShmCtx<'_> {
    fn n(&self) -> usize {
        self.shm.node.nlocal()
    }

    fn me(&self) -> usize {
        self.shm.node.me
    }

    /// The buffer of rank `i` for the current round.
    fn buf(&self, i: usize) -> Span {
        self.shm.node.coll(i, (self.shm.coll_rounds % 2) as usize)
    }

    fn capacity(&self) -> usize {
        self.shm.node.layout().sizes.coll_bytes
    }

    fn next_round(&mut self) {
        self.shm.coll_rounds += 1;
    }

    /// Announces this rank's arrival and waits for everyone's.
    fn barrier(&mut self) -> Result<(), ShmFail> {
        self.shm.arrivals += 1;
        let target = self.shm.arrivals;
        let node = &self.shm.node;
        node.control(node.me)
            .arrived
            .store(target, Ordering::Release);
        node.ring_others();
        let all_in = |n: &super::node::Node| {
            (0..n.nlocal()).all(|i| n.control(i).arrived.load(Ordering::Acquire) >= target)
        };
        match node.wait_for(all_in, self.deadline, self.alive) {
            Ok(()) => Ok(()),
            Err(WaitEnd::Failed(e)) => Err(ShmFail::Peer(e)),
            Err(WaitEnd::Deadline) => {
                let late = (0..node.nlocal())
                    .find(|&i| node.control(i).arrived.load(Ordering::Acquire) < target);
                Err(ShmFail::Deadline {
                    waiting_for: late.map(|l| self.shm.global_of[l]),
                })
            }
        }
    }
}

/// In-place all_reduce of `buf`. Per round: copy in only the slices peers reduce, reduce this
/// rank's slice from its own buffer and the peers' shared copies, then copy
/// every reduced slice out.
pub fn all_reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    let chunk = (cx.capacity() / es) * es;
    for (off, len) in chunks(buf.len(), chunk) {
        let slices = partition(len / es, n, es);
        for &(so, sl) in slices
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != me)
            .map(|(_, s)| s)
        {
            load_input(red, cx.buf(me).sub(so, sl), buf.sub(off + so, sl));
        }
        cx.barrier()?;
        let (so, sl) = slices[me];
        let acc = cx.buf(me).sub(so, sl);
        let own = buf.sub(off + so, sl);
        // (The fused three-operand kernel measured slower here than load + combine.)
        load_input(red, acc, own);
        for j in (0..n).filter(|&j| j != me) {
            combine(red, acc, cx.buf(j).sub(so, sl));
        }
        finish(red, acc);
        cx.barrier()?;
        for (j, &(so, sl)) in slices.iter().enumerate() {
            buf.sub(off + so, sl).copy_from(&cx.buf(j).sub(so, sl));
        }
        cx.next_round();
    }
    Ok(())
}

/// all_gather (blocks may differ in size): `outputs[j]` receives rank `j`'s input.
pub fn all_gather(cx: &mut ShmCtx<'_>, input: Span, outputs: &[Span]) -> Result<(), ShmFail> {
    let me = cx.me();
    let longest = outputs.iter().map(Span::len).max().unwrap_or(0);
    let cap = cx.capacity();
    for off in (0..longest).step_by(cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(cap));
        let mine = piece(&input);
        cx.buf(me).copy_from(&mine);
        cx.barrier()?;
        for (j, out) in outputs.iter().enumerate() {
            let dst = piece(out);
            dst.copy_from(&cx.buf(j).sub(0, dst.len()));
        }
        cx.next_round();
    }
    Ok(())
}

/// broadcast of `root`'s `buf`.
pub fn broadcast(cx: &mut ShmCtx<'_>, buf: Span, root: usize) -> Result<(), ShmFail> {
    let me = cx.me();
    for (off, len) in chunks(buf.len(), cx.capacity()) {
        if me == root {
            cx.buf(me).copy_from(&buf.sub(off, len));
        }
        cx.barrier()?;
        if me != root {
            buf.sub(off, len).copy_from(&cx.buf(root).sub(0, len));
        }
        cx.next_round();
    }
    Ok(())
}

/// reduce_scatter (blocks may differ in size): rank `r` gets the reduction of every rank's
/// `inputs[r]`.
pub fn reduce_scatter(
    cx: &mut ShmCtx<'_>,
    inputs: &[Span],
    output: Span,
    red: &Reducer,
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    // Each round carries one piece of every block, side by side in the buffer.
    let piece_cap = (cx.capacity() / n / es).max(1) * es;
    let longest = inputs.iter().map(Span::len).max().unwrap_or(0);
    for off in (0..longest).step_by(piece_cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(piece_cap));
        for (j, inp) in inputs.iter().enumerate() {
            let src = piece(inp);
            load_input(red, cx.buf(me).sub(j * piece_cap, src.len()), src);
        }
        cx.barrier()?;
        let dst = piece(&output);
        let len = dst.len();
        let at = me * piece_cap;
        // Reduce in rank order into a scratch slot of our own buffer's block, then copy out:
        // `output` may alias our own input block, which was already copied in.
        let acc = cx.buf(me).sub(at, len);
        for j in (0..n).filter(|&j| j != me) {
            combine(red, acc, cx.buf(j).sub(at, len));
        }
        finish(red, acc);
        dst.copy_from(&acc);
        cx.next_round();
    }
    Ok(())
}

/// reduce onto `root`; other ranks' buffers are only read.
pub fn reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer, root: usize) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    let chunk = (cx.capacity() / es) * es;
    for (off, len) in chunks(buf.len(), chunk) {
        load_input(red, cx.buf(me).sub(0, len), buf.sub(off, len));
        cx.barrier()?;
        if me == root {
            let acc = cx.buf(me).sub(0, len);
            for j in (0..n).filter(|&j| j != me) {
                combine(red, acc, cx.buf(j).sub(0, len));
            }
            finish(red, acc);
            buf.sub(off, len).copy_from(&acc);
        }
        cx.next_round();
    }
    Ok(())
}
