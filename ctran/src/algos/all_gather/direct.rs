//! Direct all_gather: every rank sends its input to every other rank and receives every block
//! straight into place, all transfers in flight at once: one latency step, for small messages.
//! Blocks may differ in size (all_gather_v).

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct all_gather; `outputs[i]` receives rank `i`'s input.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&input);
    let mut reqs = Vec::with_capacity(2 * n);
    for k in 1..n {
        let from = (r + n - k) % n;
        reqs.push(cx.recv(from, outputs[from])?);
    }
    for k in 1..n {
        reqs.push(cx.send((r + k) % n, outputs[r])?);
    }
    cx.wait_all(&mut reqs)
}
