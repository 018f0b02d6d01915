//! Direct broadcast: the root sends its whole buffer to every other rank, all transfers in
//! flight at once: one latency step, for small messages (the root moves `n-1` buffers).
//!
//! Large buffers go in staging-chunk pieces, as the chain and the tree send them: over TCP on
//! loopback one message of many megabytes is slower than the same bytes in pieces (in pieces,
//! direct keeps pace with the chain on 2 ranks and takes about a tenth less time on 4 and 8).

use crate::algos::ctx::OpCtx;
use crate::algos::pipe;
use crate::error::Result;
use crate::span::Span;

/// Runs the direct broadcast of `buf` from `root`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, root: usize) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let chunk = cx.staging.chunk_for(1);
    if r != root {
        let mut reqs = pipe::post_recv_chunked(cx, root, buf, chunk)?;
        return cx.wait_all(&mut reqs);
    }
    let mut reqs = Vec::with_capacity(n);
    for k in 1..n {
        reqs.extend(pipe::post_send_chunked(cx, (root + k) % n, buf, chunk)?);
    }
    cx.wait_all(&mut reqs)
}
