//! Ring reduce_scatter, chunked: for each chunk offset, the partial sum of block `j` travels
//! the ring, each rank adding its own input, and lands complete on rank `j`. Partials live in two
//! staging slots, so memory stays fixed and the inputs are never written.

use crate::algos::ctx::{self, OpCtx};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

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
    let chunk = cx.staging.chunk_for(dtype.size_bytes());
    let slots = [cx.staging.slot(0), cx.staging.slot(1)];
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let longest = inputs.iter().map(Span::len).max().unwrap_or(0);
    // The piece of block `j` at chunk offset `off` (empty past the block's end).
    let piece = |j: usize, off: usize| {
        let len = inputs[j].len().saturating_sub(off).min(chunk);
        inputs[j].sub(off.min(inputs[j].len()), len)
    };
    // Every rank agrees on the block sizes, so every rank runs the same number of rounds.
    for off in (0..longest).step_by(chunk) {
        if n == 1 {
            let src = piece(0, off);
            let dst = slots[0].sub(0, src.len());
            ctx::load_input(&red, dst, src);
            ctx::finish(&red, dst);
            output.sub(off, src.len()).copy_from(&dst);
        } else {
            let mut cur = 0;
            for s in 0..n - 1 {
                let send_block = (r + n - s - 1) % n;
                let recv_block = (r + 2 * n - s - 2) % n;
                let send = if s == 0 {
                    let src = piece(send_block, off);
                    if red.needs_prescale() {
                        let dst = slots[cur].sub(0, src.len());
                        ctx::load_input(&red, dst, src);
                        dst
                    } else {
                        src
                    }
                } else {
                    slots[cur].sub(0, piece(send_block, off).len())
                };
                let mine = piece(recv_block, off);
                let next = 1 - cur;
                let landing = slots[next].sub(0, mine.len());
                cx.sendrecv(right, send, left, landing)?;
                ctx::combine_input(&red, landing, mine);
                cur = next;
            }
            let result = slots[cur].sub(0, piece(r, off).len());
            ctx::finish(&red, result);
            output.sub(off, result.len()).copy_from(&result);
        }
    }
    Ok(())
}
