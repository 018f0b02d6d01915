//! Pipelined chain broadcast for large messages: the ranks form a chain starting at the root
//! (`root, root+1, ...`), the buffer travels in staging-chunk pieces, and each rank forwards a
//! piece as soon as it landed. Every rank sends and receives the buffer once, so the time
//! approaches one buffer transfer plus `n-2` piece transfers, whatever `n`. Data lands directly
//! in the caller's buffer (no staging).

use crate::algos::ctx::{chunks, OpCtx};
use crate::algos::pipe;
use crate::error::Result;
use crate::span::Span;

/// Runs the chain broadcast of `buf` from `root`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, root: usize) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    if n == 1 {
        return Ok(());
    }
    let pos = (r + n - root) % n;
    let next = (pos + 1 < n).then_some((r + 1) % n);
    let chunk = cx.staging.chunk_for(1);
    if pos == 0 {
        let mut sends = match next {
            Some(to) => pipe::post_send_chunked(cx, to, buf, chunk)?,
            None => Vec::new(),
        };
        return cx.wait_all(&mut sends);
    }
    let prev = (r + n - 1) % n;
    let recvs = pipe::post_recv_chunked(cx, prev, buf, chunk)?;
    let mut sends = Vec::new();
    for (req, (off, len)) in recvs.into_iter().zip(chunks(buf.len(), chunk)) {
        cx.wait(req)?;
        if let Some(to) = next {
            sends.push(cx.send(to, buf.sub(off, len))?);
        }
    }
    cx.wait_all(&mut sends)
}
