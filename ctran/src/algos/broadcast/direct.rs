//! Direct broadcast: the root sends its whole buffer to every other rank, all transfers in
//! flight at once: one latency step, for small messages (the root moves `n-1` buffers).

use crate::algos::ctx::OpCtx;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct broadcast of `buf` from `root`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, root: usize) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    if r != root {
        let req = cx.recv(root, buf)?;
        return cx.wait(req);
    }
    let mut reqs = Vec::with_capacity(n);
    for k in 1..n {
        reqs.push(cx.send((root + k) % n, buf)?);
    }
    cx.wait_all(&mut reqs)
}
