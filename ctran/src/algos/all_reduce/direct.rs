//! Direct (one-shot) all_reduce for small messages: every rank sends its whole buffer to every
//! other rank and reduces all `n` contributions itself, in one latency step. Every rank reduces
//! in rank order 0..n-1 with the same kernels, so the results are bitwise identical everywhere.
//! Moves `(n-1)` buffers per rank, so it only pays off while latency dominates.
//!
//! Received pieces go through staging (one round of pieces from all peers fits one chunk,
//! double-buffered), so memory stays fixed whatever the size.

use crate::algos::ctx::OpCtx;
use crate::algos::pipe;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the direct all_reduce in place on `buf`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, dtype: DataType, op: ReduceOp) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let piece = pipe::direct_piece(cx, n, dtype.size_bytes());
    let sends: Vec<(usize, Span)> = (1..n).map(|k| ((r + k) % n, buf)).collect();
    pipe::direct_reduce(cx, &red, &sends, Some((buf, buf)), piece, 0)
}
