//! Ring all_gather: in step `s` each rank forwards the block it received in step `s-1` to its
//! right neighbour, `n-1` steps moving `(n-1)/n` of the output per rank (bandwidth-optimal).
//! Blocks travel in staging-chunk pieces straight from output to output, and a piece is
//! forwarded as soon as it landed, so steps overlap. Blocks may differ in size (all_gather_v).

use crate::algos::ctx::{chunks, OpCtx};
use crate::algos::pipe;
use crate::error::Result;
use crate::span::Span;

/// Runs the ring all_gather; `outputs[i]` receives rank `i`'s input.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&input);
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let chunk = cx.staging.chunk_for(1);
    let mut sends = pipe::post_send_chunked(cx, right, outputs[r], chunk)?;
    // Every receive lands in its final place, so all of them can be posted at once.
    let mut recvs = Vec::new();
    for s in 0..n - 1 {
        let block = outputs[(r + 2 * n - s - 1) % n];
        for (off, len) in chunks(block.len(), chunk) {
            let piece = block.sub(off, len);
            recvs.push((cx.recv(left, piece)?, piece, s < n - 2));
        }
    }
    for (req, piece, forward) in recvs {
        cx.wait(req)?;
        if forward {
            sends.push(cx.send(right, piece)?);
        }
    }
    cx.wait_all(&mut sends)
}
