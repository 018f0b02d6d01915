//! Direct reduce: every rank sends its buffer to the root at once, and the root reduces the `n`
//! contributions in rank order: one latency step, for small messages (the root receives `n-1`
//! buffers). Pieces go through staging, so memory stays fixed; non-root buffers are never
//! written.

use crate::algos::ctx::OpCtx;
use crate::algos::pipe;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the direct reduce of `buf` onto `root`.
pub fn run(
    cx: &mut OpCtx<'_>,
    buf: Span,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let n = cx.size;
    let red = Reducer::new(dtype, op, n)?;
    let piece = pipe::direct_piece(cx, n, dtype.size_bytes());
    if cx.rank == root {
        pipe::direct_reduce(cx, &red, &[], Some((buf, buf)), piece, 0)
    } else {
        pipe::direct_reduce(cx, &red, &[(root, buf)], None, piece, 0)
    }
}
