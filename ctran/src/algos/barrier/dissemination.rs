//! Dissemination barrier: in round `k` each rank signals rank `r + 2^k` and waits for rank
//! `r - 2^k`; after `ceil(log2 n)` rounds everyone has heard, indirectly, from everyone.

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the dissemination barrier.
pub fn run(cx: &mut OpCtx<'_>) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let mut dist = 1;
    while dist < n {
        cx.sendrecv((r + dist) % n, Span::EMPTY, (r + n - dist) % n, Span::EMPTY)?;
        dist *= 2;
    }
    Ok(())
}
