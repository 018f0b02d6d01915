//! Ring all_gather: in step `s` each rank forwards the block it received in step `s-1` to its
//! right neighbour. Blocks go straight from output to output, so no staging is needed, and
//! blocks may differ in size (all_gather_v).

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the ring all_gather; `outputs[i]` receives rank `i`'s input.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&input);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    for s in 0..n.saturating_sub(1) {
        let send = outputs[(r + n - s) % n];
        let recv = outputs[(r + 2 * n - s - 1) % n];
        cx.sendrecv(right, send, left, recv)?;
    }
    Ok(())
}
