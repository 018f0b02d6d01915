//! Direct gather: the root receives from every rank at once.

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct gather onto `root`.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span], root: usize) -> Result<()> {
    if cx.rank != root {
        let req = cx.send(root, input)?;
        return cx.wait(req);
    }
    let mut reqs = Vec::with_capacity(cx.size);
    for (peer, block) in outputs.iter().enumerate() {
        if peer != root {
            reqs.push(cx.recv(peer, *block)?);
        }
    }
    outputs[root].copy_from(&input);
    cx.wait_all(&mut reqs)
}
