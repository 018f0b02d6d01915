//! Ring all_reduce: a reduce-scatter around the ring followed by an all-gather, moving
//! `2 (n-1)/n` of the buffer per rank (bandwidth-optimal). Each segment is reduced by exactly one
//! rank and then copied to the others, so every rank ends with bitwise the same result.
//!
//! Pipelined across steps: segments travel in staging-chunk pieces, and a piece is forwarded to
//! the right neighbour as soon as it was reduced (or, in the all-gather, received), while later
//! pieces and steps are still in flight. Reduce-scatter pieces land in a ring of staging slots;
//! all-gather pieces land directly in the buffer.

use std::collections::VecDeque;

use crate::algos::ctx::{self, chunks, partition, OpCtx};
use crate::algos::pipe;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::ReqId;
use crate::types::{DataType, ReduceOp};

/// Staging slots the reduce-scatter keeps receiving into.
const SLOTS: usize = 4;

/// One piece received from the left neighbour.
#[derive(Debug, Clone, Copy)]
struct Unit {
    /// Where it belongs in the buffer.
    dst: Span,
    /// Reduce-scatter piece (lands in a slot and is reduced) or all-gather piece (lands in place).
    reduce: bool,
    /// Last reduce-scatter step: the piece is final after the reduction.
    last: bool,
    /// Passed on to the right neighbour once complete.
    forward: bool,
}

/// Runs the ring all_reduce in place on `buf`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, dtype: DataType, op: ReduceOp) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let es = dtype.size_bytes();
    ctx::prescale(&red, buf);
    if n == 1 {
        ctx::finish(&red, buf);
        return Ok(());
    }
    let segs = partition(buf.len() / es, n, es);
    let seg = |i: usize| buf.sub(segs[i].0, segs[i].1);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let chunk = cx.staging.chunk_for(es);

    let mut units = Vec::new();
    for s in 0..n - 1 {
        let dst = seg((r + 2 * n - s - 1) % n);
        for (off, len) in chunks(dst.len(), chunk) {
            units.push(Unit {
                dst: dst.sub(off, len),
                reduce: true,
                last: s == n - 2,
                forward: true,
            });
        }
    }
    for s in 0..n - 1 {
        let dst = seg((r + n - s) % n);
        for (off, len) in chunks(dst.len(), chunk) {
            units.push(Unit {
                dst: dst.sub(off, len),
                reduce: false,
                last: false,
                forward: s < n - 2,
            });
        }
    }
    let slots: Vec<Span> = (0..SLOTS).map(|i| cx.staging.slot(i)).collect();
    let post = |cx: &mut OpCtx<'_>, u: usize| -> Result<ReqId> {
        let unit = units[u];
        let into = if unit.reduce {
            slots[u % SLOTS].sub(0, unit.dst.len())
        } else {
            unit.dst
        };
        cx.recv(left, into)
    };

    let mut sends = pipe::post_send_chunked(cx, right, seg(r), chunk)?;
    let mut recvs = VecDeque::new();
    for u in 0..units.len().min(SLOTS) {
        recvs.push_back(post(cx, u)?);
    }
    for (u, unit) in units.iter().enumerate() {
        let req = recvs
            .pop_front()
            .expect("a receive is posted for every unit");
        cx.wait(req)?;
        if unit.reduce {
            ctx::combine(&red, unit.dst, slots[u % SLOTS].sub(0, unit.dst.len()));
            if unit.last {
                ctx::finish(&red, unit.dst);
            }
        }
        if unit.forward {
            sends.push(cx.send(right, unit.dst)?);
        }
        if u + SLOTS < units.len() {
            recvs.push_back(post(cx, u + SLOTS)?);
        }
    }
    cx.wait_all(&mut sends)
}
