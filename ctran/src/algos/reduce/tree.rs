//! Binomial-tree reduce, chunked: each rank reduces its children's partials for one chunk into
//! staging and passes the result to its parent, so memory stays at a few chunks whatever the
//! message size and non-root buffers are never written.

use crate::algos::ctx::{self, chunks, OpCtx};
use crate::algos::tree::BinomialTree;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the tree reduce of `buf` onto `root`.
pub fn run(
    cx: &mut OpCtx<'_>,
    buf: Span,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let red = Reducer::new(dtype, op, cx.size)?;
    let tree = BinomialTree::new(cx.rank, cx.size, root);
    let chunk = cx.staging.chunk_for(dtype.size_bytes());
    let accs = [cx.staging.slot(0), cx.staging.slot(1)];
    let tmps: Vec<Span> = (0..tree.children.len())
        .map(|i| cx.staging.slot(2 + i))
        .collect();
    let mut pending_send = [None, None];
    for (k, (off, len)) in chunks(buf.len(), chunk).enumerate() {
        let acc = accs[k % 2].sub(0, len);
        if let Some(req) = pending_send[k % 2].take() {
            cx.wait(req)?;
        }
        let mut recvs = Vec::with_capacity(tree.children.len());
        for (i, &child) in tree.children.iter().enumerate() {
            recvs.push(cx.recv(child, tmps[i].sub(0, len))?);
        }
        ctx::load_input(&red, acc, buf.sub(off, len));
        for (i, req) in recvs.into_iter().enumerate() {
            cx.wait(req)?;
            ctx::combine(&red, acc, tmps[i].sub(0, len));
        }
        match tree.parent {
            Some(parent) => pending_send[k % 2] = Some(cx.send(parent, acc)?),
            None => {
                ctx::finish(&red, acc);
                buf.sub(off, len).copy_from(&acc);
            }
        }
    }
    for req in pending_send.into_iter().flatten() {
        cx.wait(req)?;
    }
    Ok(())
}
