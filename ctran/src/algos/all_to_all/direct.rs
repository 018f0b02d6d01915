//! Direct all_to_all: every send and receive is in flight at once; the transport interleaves
//! them. Blocks go straight from input to output.

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct all_to_all.
pub fn run(cx: &mut OpCtx<'_>, inputs: &[Span], outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&inputs[r]);
    let mut reqs = Vec::with_capacity(2 * n);
    for k in 1..n {
        let from = (r + n - k) % n;
        reqs.push(cx.recv(from, outputs[from])?);
    }
    for k in 1..n {
        let to = (r + k) % n;
        reqs.push(cx.send(to, inputs[to])?);
    }
    cx.wait_all(&mut reqs)
}
