//! Pairwise-exchange all_to_all: in step `k` (1..n) rank `r` sends its block for rank `r+k` and
//! receives the block of rank `r-k`, one exchange at a time, which keeps one transfer per
//! direction on each link (less contention than [`direct`](super::direct) for large blocks).
//! Blocks go straight from input to output and may differ in size (all_to_all_v).
//!
//! On the wire it is the same as the direct algorithm (one message per ordered pair), so ranks
//! running one and ranks running the other still match.

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the pairwise all_to_all.
pub fn run(cx: &mut OpCtx<'_>, inputs: &[Span], outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&inputs[r]);
    for k in 1..n {
        let (to, from) = ((r + k) % n, (r + n - k) % n);
        cx.sendrecv(to, inputs[to], from, outputs[from])?;
    }
    Ok(())
}
