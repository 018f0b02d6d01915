//! The reductions: all_reduce (through the shared buffers, or by cross-memory attach),
//! reduce_scatter and reduce.

use std::sync::atomic::Ordering;

use crate::algos::ctx::{
    chunks, combine, combine_input, finish, fold_onto, load_input, partition, prescale,
};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::shm::node::{Node, WaitEnd};

use super::ctx::wait_telling;
use super::*;

/// The cache-resident buffer peers' data is read into before it is combined.
pub(super) fn scratch(cx: &mut ShmCtx<'_>) -> Span {
    // SAFETY: the buffer belongs to this lane, which only the thread running the lane uses, and
    // lends to this collective alone; it is neither resized nor otherwise touched while the
    // span is used.
    unsafe { Span::from_slice(&mut cx.lane.cma_buf) }
}

/// `dst ⊕= prescale(peer j's block k from offset)`, through the scratch buffer in pieces.
pub(super) fn combine_from_peer(
    cx: &mut ShmCtx<'_>,
    red: &Reducer,
    dst: Span,
    j: usize,
    k: usize,
    offset: usize,
) -> Result<(), ShmFail> {
    let es = red.dtype().size_bytes();
    let tmp = scratch(cx);
    let piece = (tmp.len() / es).max(1) * es;
    for (o, l) in chunks(dst.len(), piece) {
        let t = tmp.sub(0, l);
        cx.read(j, k, offset + o, t)?;
        combine_input(red, dst.sub(o, l), t);
    }
    Ok(())
}

/// `dst = prescale(own) ⊕ prescale(block k of every peer, from offset)`, combined in pieces that
/// stay in cache across peers, peers in rank order. `dst` may be `own` itself.
pub(super) fn reduce_from_peers(
    cx: &mut ShmCtx<'_>,
    red: &Reducer,
    dst: Span,
    own: Span,
    k: usize,
    offset: usize,
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    let piece = (cx.lane.cma_buf.len() / es).max(1) * es;
    for (o, l) in chunks(dst.len(), piece) {
        let d = dst.sub(o, l);
        let src = own.sub(o, l);
        if d == src {
            prescale(red, d);
        } else {
            load_input(red, d, src);
        }
        for j in (0..n).filter(|&j| j != me) {
            combine_from_peer(cx, red, d, j, k, offset + o)?;
        }
        finish(red, d);
    }
    Ok(())
}

/// In-place all_reduce of `buf`.
pub fn all_reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer) -> Result<(), ShmFail> {
    let d = Desc {
        kind: Kind::AllReduce,
        bytes: buf.len(),
        args: red_args(red).finish(),
    };
    // Its cross-memory path reads every byte twice (inputs, then results), so it pays off
    // later than the single-read collectives'. With one lane it also pays at more than two
    // ranks (a 2-core host at 4 ranks took 0.77-0.93 of the time through the shared buffers'
    // path); cut into lanes, the lanes' concurrent reads of one process contend (about the
    // same time as the shared buffers at 4 and 8 ranks on 16 cores).
    let direct = cx.n() == 2 || cx.parts == 1;
    if direct && cx.cma_fits(buf.len() / 2) {
        all_reduce_cma(cx, buf, red, d)
    } else {
        all_reduce_slots(cx, buf, red, d)
    }
}

/// Bits of [`crate::transport::shm::layout::Control::progress`] that count bytes.
pub(super) const PROGRESS_BITS: u32 = 40;

/// all_reduce by cross-memory attach: each rank reduces its slice in place, piece by piece,
/// reading the peers' copies of each piece, and announces how far it got; in between it copies
/// the pieces peers have finished into its own buffer. A finished piece of peer `j` is safe to
/// overwrite here because `j` read this rank's copy of it before reducing it, and it is likely
/// still in the shared cache when it is read. Pieces are reduced own-first, then peers in rank
/// order, each by exactly one rank, so every rank ends with bitwise the same result.
pub(super) fn all_reduce_cma(
    cx: &mut ShmCtx<'_>,
    buf: Span,
    red: &Reducer,
    d: Desc,
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let es = red.dtype().size_bytes();
    cx.publish(d, &[buf]);
    // The tag is the number of the barrier below; announcing "nothing reduced yet" under it
    // before the barrier means no peer can mistake an old value for this operation's, even
    // when the counter's top bits wrapped around since.
    let tag = ((cx.lane.arrivals + 1) & ((1 << (64 - PROGRESS_BITS)) - 1)) << PROGRESS_BITS;
    cx.lane
        .node
        .control(me)
        .progress
        .store(tag, Ordering::Release);
    cx.barrier()?;
    cx.check(d, |_| buf.len())?;
    let slices = partition(buf.len() / es, n, es);
    let (so, sl) = slices[me];
    let mine = buf.sub(so, sl);
    let piece = (cx.lane.cma_buf.len() / es).max(1) * es;
    // Bytes of each peer's slice already copied here.
    let mut copied = vec![0usize; n];
    copied[me] = sl;
    let progress = |cx: &ShmCtx<'_>, j: usize| -> usize {
        let v = cx.lane.node.control(j).progress.load(Ordering::Acquire);
        if v & !((1 << PROGRESS_BITS) - 1) == tag {
            (v & ((1 << PROGRESS_BITS) - 1)) as usize
        } else {
            0
        }
    };
    // Copies whatever peers finished; returns whether everything is here.
    let drain = |cx: &mut ShmCtx<'_>, copied: &mut [usize]| -> Result<bool, ShmFail> {
        let mut all = true;
        for j in (0..n).filter(|&j| j != me) {
            let (po, pl) = slices[j];
            let upto = progress(cx, j).min(pl);
            if upto > copied[j] {
                let from = copied[j];
                cx.read(j, 0, po + from, buf.sub(po + from, upto - from))?;
                copied[j] = upto;
            }
            all &= copied[j] == pl;
        }
        Ok(all)
    };
    for (o, l) in chunks(sl, piece) {
        let dst = mine.sub(o, l);
        prescale(red, dst);
        for j in (0..n).filter(|&j| j != me) {
            combine_from_peer(cx, red, dst, j, 0, so + o)?;
        }
        finish(red, dst);
        let node = &cx.lane.node;
        node.control(me)
            .progress
            .store(tag | (o + l) as u64, Ordering::Release);
        node.ring_others();
        drain(cx, &mut copied)?;
    }
    while !drain(cx, &mut copied)? {
        let want: Vec<usize> = slices.iter().map(|&(_, l)| l).collect();
        let ready = |nd: &Node| {
            (0..n).filter(|&j| copied[j] < want[j]).any(|j| {
                let v = nd.control(j).progress.load(Ordering::Acquire);
                v & !((1 << PROGRESS_BITS) - 1) == tag
                    && ((v & ((1 << PROGRESS_BITS) - 1)) as usize) > copied[j]
            })
        };
        let node = &cx.lane.node;
        match wait_telling(node, cx.waiting, ready, cx.deadline, cx.alive) {
            Ok(()) => {}
            Err(WaitEnd::Failed(e)) => return Err(ShmFail::Peer(e)),
            Err(WaitEnd::Deadline) => {
                let late = (0..n).find(|&j| j != me && copied[j] < slices[j].1);
                return Err(ShmFail::Deadline {
                    waiting_for: late.map(|l| cx.global(l)),
                });
            }
        }
    }
    // Keep this rank's slice unchanged until every peer has it.
    cx.barrier()
}

/// all_reduce through the shared buffers. Per round: copy in only the slices peers reduce,
/// reduce this rank's slice from its own buffer and the peers' shared copies, then copy every
/// reduced slice out.
///
/// No barrier waits for every rank: each rank announces "copied in" and "reduced" (two arrivals
/// per round), combines each peer's copy as soon as that peer announced it (own first, then
/// from the next rank up and around: one fixed order per slice, and one rank reduces each
/// slice, so the result is bitwise the same everywhere) and copies each reduced slice out as
/// soon as its owner announced it, so one late rank delays only the steps that need its data.
/// Having waited for every peer's "reduced" in round `r` is what lets a rank overwrite its
/// other buffer in round `r + 1`: each peer had finished round `r - 1`, the last to read it.
/// At 8 ranks on 16 cores the two all-rank barriers this replaces, and the doorbells they
/// rang, took 8 of the 32 us of a 64 KiB all_reduce (`docs/perf/cpu.md`).
pub(super) fn all_reduce_slots(
    cx: &mut ShmCtx<'_>,
    buf: Span,
    red: &Reducer,
    d: Desc,
) -> Result<(), ShmFail> {
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
        if off == 0 {
            cx.publish(d, &[]);
        }
        let copied = cx.arrive();
        let (so, sl) = slices[me];
        let acc = cx.buf(me).sub(so, sl);
        // (The fused three-operand kernel measured slower here than load + combine.)
        load_input(red, acc, buf.sub(off + so, sl));
        combine_from_peers(cx, red, acc, so, copied, |cx, j| {
            if off == 0 {
                cx.check_peer(d, j, buf.len())?;
            }
            Ok(())
        })?;
        finish(red, acc);
        let reduced = cx.arrive();
        buf.sub(off + so, sl).copy_from(&acc);
        copy_out_as_reduced(cx, buf.sub(off, len), &slices, reduced)?;
        cx.next_round();
    }
    Ok(())
}

/// `acc ⊕=` every peer's copy at `at` in its buffer, in [`ShmCtx::peers`] order, each once it
/// arrived at `copied` and passed `check`: the peers found ready one after the other are
/// combined in one pass.
fn combine_from_peers(
    cx: &mut ShmCtx<'_>,
    red: &Reducer,
    acc: Span,
    at: usize,
    copied: u64,
    mut check: impl FnMut(&ShmCtx<'_>, usize) -> Result<(), ShmFail>,
) -> Result<(), ShmFail> {
    let mut ready: Vec<Span> = Vec::with_capacity(cx.n());
    for j in cx.peers() {
        if !cx.arrived(j, copied) {
            fold_onto(red, acc, &ready);
            ready.clear();
            cx.wait_arrived(j, copied)?;
        }
        check(cx, j)?;
        ready.push(cx.buf(j).sub(at, acc.len()));
    }
    fold_onto(red, acc, &ready);
    Ok(())
}

/// Copies every peer's reduced slice of this round into `out`, each as soon as its owner
/// arrived at `reduced`, in [`ShmCtx::peers`] order when all are there.
fn copy_out_as_reduced(
    cx: &mut ShmCtx<'_>,
    out: Span,
    slices: &[(usize, usize)],
    reduced: u64,
) -> Result<(), ShmFail> {
    let mut left: Vec<usize> = cx.peers().collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|&j| {
            if !cx.arrived(j, reduced) {
                return true;
            }
            let (so, sl) = slices[j];
            out.sub(so, sl).copy_from(&cx.buf(j).sub(so, sl));
            false
        });
        if left.len() == before {
            let has =
                |nd: &Node, j: usize| nd.control(j).arrived.load(Ordering::Acquire) >= reduced;
            let any = |nd: &Node| left.iter().any(|&j| has(nd, j));
            let late = |nd: &Node| left.iter().copied().find(|&j| !has(nd, j));
            cx.wait_until(any, late)?;
        }
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
    let lens: Vec<usize> = inputs.iter().map(Span::len).collect();
    let d = Desc {
        kind: Kind::ReduceScatter,
        bytes: output.len(),
        args: red_args(red).usizes(&lens).finish(),
    };
    let expect = |j: usize| lens[j];
    if cx.use_cma(lens.iter().sum()) {
        cx.publish(d, inputs);
        cx.barrier()?;
        cx.check(d, expect)?;
        // `output` may be this rank's own input block (in place); no peer reads that one.
        reduce_from_peers(cx, red, output, inputs[me], me, 0)?;
        return cx.barrier();
    }
    let es = red.dtype().size_bytes();
    // Each round carries one piece of every block, side by side in the buffer.
    let piece_cap = (cx.capacity() / n / es).max(1) * es;
    let longest = lens.iter().copied().max().unwrap_or(0);
    for off in (0..longest).step_by(piece_cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(piece_cap));
        for (j, inp) in inputs.iter().enumerate() {
            let src = piece(inp);
            load_input(red, cx.buf(me).sub(j * piece_cap, src.len()), src);
        }
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, expect)?;
        }
        let dst = piece(&output);
        let len = dst.len();
        let at = me * piece_cap;
        // Reduce into our own copy of the block, peers in `peers` order (one fixed order for
        // this block, which only this rank reduces), then copy out: `output` may alias our
        // own input block, which was already copied in.
        let acc = cx.buf(me).sub(at, len);
        let peers: Vec<Span> = cx.peers().map(|j| cx.buf(j).sub(at, len)).collect();
        fold_onto(red, acc, &peers);
        finish(red, acc);
        dst.copy_from(&acc);
        cx.next_round();
    }
    Ok(())
}

/// reduce onto `root` (a local index); other ranks' buffers are only read.
pub fn reduce(cx: &mut ShmCtx<'_>, buf: Span, red: &Reducer, root: usize) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let d = Desc {
        kind: Kind::Reduce,
        bytes: buf.len(),
        args: red_args(red).u64(root as u64).finish(),
    };
    if cx.use_cma(buf.len()) {
        cx.publish(d, &[buf]);
        cx.barrier()?;
        cx.check(d, |_| buf.len())?;
        if me == root {
            reduce_from_peers(cx, red, buf, buf, 0, 0)?;
        }
        return cx.barrier();
    }
    let es = red.dtype().size_bytes();
    let chunk = (cx.capacity() / es) * es;
    for (off, len) in chunks(buf.len(), chunk) {
        load_input(red, cx.buf(me).sub(0, len), buf.sub(off, len));
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, |_| buf.len())?;
        }
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
