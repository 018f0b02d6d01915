//! Ring reduce_scatter: the partial reduction of block `j` travels the ring, each rank adding its
//! own input, and lands complete on rank `j` after `n-1` steps; `(n-1)/n` of the input moves per
//! rank (bandwidth-optimal).
//!
//! Pipelined: blocks travel in staging-chunk pieces through a ring of staging slots, and a piece
//! is passed on as soon as this rank added its input, while later pieces and steps are in
//! flight. Inputs are never written; blocks may differ in size (reduce_scatter_v).

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
    let mut units = Vec::new();
    for step in 0..n - 1 {
        let block = (r + 2 * n - step - 2) % n;
        for (off, len) in chunks(inputs[block].len(), chunk) {
            units.push(Unit {
                step,
                mine: inputs[block].sub(off, len),
                out_off: off,
            });
        }
    }
    let slots: Vec<Span> = (0..SLOTS).map(|i| cx.staging.slot(i)).collect();
    let landing = |u: usize| slots[u % SLOTS].sub(0, units[u].mine.len());

    // Step 0 sends this rank's raw input for block r-1; the receiver prescales it.
    let first = inputs[(r + n - 1) % n];
    let mut direct: Vec<ReqId> = chunks(first.len(), chunk)
        .map(|(off, len)| cx.send(right, first.sub(off, len)))
        .collect::<Result<_>>()?;
    let mut slot_sends: VecDeque<(usize, ReqId)> = VecDeque::new();
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
        if unit.step < n - 2 {
            slot_sends.push_back((u, cx.send(right, acc)?));
        } else {
            ctx::finish(&red, acc);
            output.sub(unit.out_off, acc.len()).copy_from(&acc);
        }
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
