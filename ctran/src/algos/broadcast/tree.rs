//! Binomial-tree broadcast, pipelined in chunks: a rank forwards chunk `k` to its children as
//! soon as it arrives, while later chunks are still on their way. Data lands directly in the
//! caller's buffer (no staging).

use crate::algos::ctx::{chunks, OpCtx};
use crate::algos::tree::BinomialTree;
use crate::error::Result;
use crate::span::Span;

/// Runs the tree broadcast of `buf` from `root`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, root: usize) -> Result<()> {
    let tree = BinomialTree::new(cx.rank, cx.size, root);
    let chunk = cx.staging.chunk_for(1);
    let pieces: Vec<(usize, usize)> = chunks(buf.len(), chunk).collect();
    let recvs = match tree.parent {
        Some(p) => pieces
            .iter()
            .map(|&(o, l)| cx.recv(p, buf.sub(o, l)))
            .collect::<Result<Vec<_>>>()?,
        None => Vec::new(),
    };
    let mut sends = Vec::new();
    for (k, &(off, len)) in pieces.iter().enumerate() {
        if let Some(&req) = recvs.get(k) {
            cx.wait(req)?;
        }
        for &child in &tree.children {
            sends.push(cx.send(child, buf.sub(off, len))?);
        }
    }
    cx.wait_all(&mut sends)
}
