//! Bruck all_gather: in round `k` each rank sends the blocks it holds so far (its own and the
//! next ones, `2^k` of them) to rank `r - 2^k` and receives as many from rank `r + 2^k`, so
//! `ceil(log2 n)` rounds suffice for any rank count. Latency-optimal for small messages.
//!
//! The blocks a round moves are a [`Stream`] over the outputs (wrapping around the rank order),
//! so no rotation buffer is needed: pieces that are contiguous move straight from output to
//! output, the others through a staging chunk. Blocks may differ in size (all_gather_v).

use crate::algos::ctx::OpCtx;
use crate::algos::pipe::{self, Stream};
use crate::error::Result;
use crate::span::Span;

/// Runs the Bruck all_gather; `outputs[i]` receives rank `i`'s input.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&input);
    let chunk = cx.staging.chunk_for(1);
    let mut have = 1;
    while have < n {
        let count = have.min(n - have);
        let send = Stream::new((0..count).map(|j| outputs[(r + j) % n]));
        let recv = Stream::new((0..count).map(|j| outputs[(r + have + j) % n]));
        let (to, from) = ((r + n - have) % n, (r + have) % n);
        pipe::exchange(cx, Some((to, &send)), Some((from, &recv)), chunk, 0)?;
        have += count;
    }
    Ok(())
}
