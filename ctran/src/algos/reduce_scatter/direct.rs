//! Direct reduce_scatter: every rank sends block `j` of its input to rank `j`, all at once, and
//! reduces the `n` contributions to its own block in rank order: one latency step, for small
//! messages. Received pieces go through staging, so memory stays fixed; blocks may differ in
//! size (reduce_scatter_v).

use crate::algos::ctx::OpCtx;
use crate::algos::pipe;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the direct reduce_scatter; `inputs[j]` is this rank's contribution to rank `j`.
pub fn run(
    cx: &mut OpCtx<'_>,
    inputs: &[Span],
    output: Span,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let piece = pipe::direct_piece(cx, n, dtype.size_bytes());
    let sends: Vec<(usize, Span)> = (1..n)
        .map(|k| {
            let j = (r + k) % n;
            (j, inputs[j])
        })
        .collect();
    pipe::direct_reduce(cx, &red, &sends, Some((inputs[r], output)), piece, 0)
}
