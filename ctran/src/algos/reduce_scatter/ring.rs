//! Ring reduce_scatter: the partial reduction of block `j` travels the ring, each rank adding its
//! own input, and lands complete on rank `j` after `n-1` steps; `(n-1)/n` of the input moves per
//! rank (bandwidth-optimal).
//!
//! Pipelined: blocks travel in staging-chunk pieces through a ring of staging slots, and a piece
//! is passed on as soon as this rank added its input, while later pieces and steps are in
//! flight. Inputs are never written; blocks may differ in size (reduce_scatter_v).
//!
//! Pieces go piece-major (piece 0 through every step, then piece 1, ...), as in NCCL's ring: a
//! staging slot is freed only once the right neighbour accepted the piece it holds, so the right
//! neighbour must never have to receive more than a slot ring's worth of other data first. In
//! step-major order it would (a whole block of step 0 before any piece of step 1), and once a
//! block exceeded the slots plus what the transport buffers, every rank waited for its right
//! neighbour to free a slot: a cyclic wait. Piece-major, the piece a rank waits to pass on is
//! always the next one its right neighbour receives after pieces that come earlier in this order,
//! so every wait points to an earlier piece and the ring cannot lock up, whatever the transport
//! buffers.

use std::collections::VecDeque;

use crate::algos::ctx::{self, chunks, OpCtx};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::ReqId;
use crate::types::{DataType, ReduceOp};

/// Pieces received ahead of the one being reduced (a short window stalls the ring whenever a
/// neighbour is descheduled on an oversubscribed host).
const AHEAD: usize = 4;
/// Staging slots in the ring: a slot stays busy until the piece it holds was passed on.
const SLOTS: usize = 2 * AHEAD;

/// One piece received from the left neighbour.
#[derive(Debug, Clone, Copy)]
struct Unit {
    step: usize,
    /// This rank's input for the piece.
    mine: Span,
    /// Where a final piece goes.
    out_off: usize,
}

/// What this rank sends to its right neighbour, in the order the neighbour receives it.
#[derive(Debug, Clone, Copy)]
enum Out {
    /// A piece of this rank's raw input for block `r-1` (the neighbour's step 0).
    Raw(Span),
    /// The partial reduction of unit `u`, passed on from its staging slot.
    Pass(usize),
}

/// Per piece index, the units of every step, in step order: the order in which a rank receives
/// from its left neighbour (step `s` of a piece is block `r-2-s`). Pieces a smaller block lacks
/// are skipped, on both sides alike.
fn piece_major(inputs: &[Span], n: usize, r: usize, chunk: usize) -> Vec<Unit> {
    let block = |step: usize| inputs[(r + 2 * n - step - 2) % n];
    let pieces = (0..n - 1)
        .map(|s| block(s).len().div_ceil(chunk))
        .max()
        .unwrap_or(0);
    let mut units = Vec::new();
    for p in 0..pieces {
        for step in 0..n - 1 {
            let b = block(step);
            let off = p * chunk;
            if off < b.len() {
                units.push(Unit {
                    step,
                    mine: b.sub(off, chunk.min(b.len() - off)),
                    out_off: off,
                });
            }
        }
    }
    units
}

/// Runs the ring reduce_scatter; `inputs[j]` is this rank's contribution to rank `j`.
pub fn run(
    cx: &mut OpCtx<'_>,
    inputs: &[Span],
    output: Span,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    if n == 1 {
        ctx::load_result(&red, output, inputs[0]);
        return Ok(());
    }
    let chunk = cx.staging.chunk_for(dtype.size_bytes());
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let units = piece_major(inputs, n, r, chunk);
    let slots: Vec<Span> = (0..SLOTS).map(|i| cx.staging.slot(i)).collect();
    let landing = |u: usize| slots[u % SLOTS].sub(0, units[u].mine.len());

    // The right neighbour's receive order, built from the same rule on its side: piece `p` of
    // its step 0 is this rank's raw input for block r-1, piece `p` of its step `s + 1` is this
    // rank's unit (p, s).
    let first = inputs[(r + n - 1) % n];
    let mut raw = chunks(first.len(), chunk).map(|(off, len)| first.sub(off, len));
    let mut outs: VecDeque<Out> = VecDeque::new();
    let mut raw_index = 0;
    for (u, unit) in units.iter().enumerate().filter(|(_, u)| u.step < n - 2) {
        // Its step 0 of every piece up to this one comes first (raw pieces are a prefix).
        let p = unit.out_off / chunk;
        while raw_index <= p {
            outs.extend(raw.next().map(Out::Raw));
            raw_index += 1;
        }
        outs.push_back(Out::Pass(u));
    }
    outs.extend(raw.map(Out::Raw));

    let mut direct: Vec<ReqId> = Vec::new();
    let mut slot_sends: VecDeque<(usize, ReqId)> = VecDeque::new();
    // Posts every send of the right neighbour's order that is ready: raw pieces at once, passed
    // pieces once reduced (units below `done` are).
    let mut post_ready = |cx: &mut OpCtx<'_>,
                          done: usize,
                          direct: &mut Vec<ReqId>,
                          slot_sends: &mut VecDeque<(usize, ReqId)>|
     -> Result<()> {
        while let Some(&o) = outs.front() {
            match o {
                Out::Raw(piece) => direct.push(cx.send(right, piece)?),
                Out::Pass(u) if u < done => slot_sends.push_back((u, cx.send(right, landing(u))?)),
                Out::Pass(_) => break,
            }
            outs.pop_front();
        }
        Ok(())
    };
    post_ready(cx, 0, &mut direct, &mut slot_sends)?;
    let mut recvs = VecDeque::new();
    for u in 0..units.len().min(AHEAD) {
        recvs.push_back(cx.recv(left, landing(u))?);
    }
    for (u, unit) in units.iter().enumerate() {
        let req = recvs
            .pop_front()
            .expect("a receive is posted for every unit");
        cx.wait(req)?;
        let acc = landing(u);
        if unit.step == 0 {
            ctx::prescale(&red, acc);
        }
        ctx::combine_input(&red, acc, unit.mine);
        if unit.step == n - 2 {
            ctx::finish(&red, acc);
            output.sub(unit.out_off, acc.len()).copy_from(&acc);
        }
        post_ready(cx, u + 1, &mut direct, &mut slot_sends)?;
        let next = u + AHEAD;
        if next < units.len() {
            // The slot of `next` last held unit `next - SLOTS`: wait until it was passed on.
            while slot_sends.front().is_some_and(|&(v, _)| v + SLOTS <= next) {
                let (_, req) = slot_sends.pop_front().expect("checked");
                cx.wait(req)?;
            }
            recvs.push_back(cx.recv(left, landing(next))?);
        }
    }
    direct.extend(slot_sends.into_iter().map(|(_, req)| req));
    cx.wait_all(&mut direct)
}
