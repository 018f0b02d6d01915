//! Direct scatter: the root sends every block at once.

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct scatter from `root`.
pub fn run(cx: &mut OpCtx<'_>, inputs: &[Span], output: Span, root: usize) -> Result<()> {
    if cx.rank != root {
        let req = cx.recv(root, output)?;
        return cx.wait(req);
    }
    let mut reqs = Vec::with_capacity(cx.size);
    for (peer, block) in inputs.iter().enumerate() {
        if peer != root {
            reqs.push(cx.send(peer, *block)?);
        }
    }
    output.copy_from(&inputs[root]);
    cx.wait_all(&mut reqs)
}
