//! Binomial-tree reduce, chunked: each rank reduces its children's partials for one chunk and
//! passes the result to its parent, so memory stays at a few chunks whatever the message size,
//! and non-root buffers are never written.
//!
//! Receives from the children run one chunk ahead of the reduction; the root reduces straight
//! into its buffer, a leaf whose input needs no scaling sends straight from its buffer, and an
//! inner rank combines its input with its first child's partial into staging in one pass.

use crate::algos::ctx::{self, chunks, OpCtx};
use crate::algos::tree::BinomialTree;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::ReqId;
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
    let kids = tree.children.len();
    let chunk = cx.staging.chunk_for(dtype.size_bytes());
    let pieces: Vec<(usize, usize)> = chunks(buf.len(), chunk).collect();
    let accs = [cx.staging.slot(0), cx.staging.slot(1)];
    // Landing slots of the children's partials, two sets so the next chunk is in flight.
    let tmps: Vec<Span> = (0..2 * kids).map(|i| cx.staging.slot(2 + i)).collect();
    let landing = |k: usize, i: usize, len: usize| tmps[(k % 2) * kids + i].sub(0, len);
    let post = |cx: &mut OpCtx<'_>, k: usize| -> Result<Vec<ReqId>> {
        tree.children
            .iter()
            .enumerate()
            .map(|(i, &child)| cx.recv(child, landing(k, i, pieces[k].1)))
            .collect()
    };
    if tree.parent.is_none() {
        ctx::prescale(&red, buf);
    }
    let mut ahead = match pieces.first() {
        Some(_) if kids > 0 => Some(post(cx, 0)?),
        _ => None,
    };
    let mut pending_send: [Option<ReqId>; 2] = [None, None];
    let mut direct_sends = Vec::new();
    for (k, &(off, len)) in pieces.iter().enumerate() {
        let mine = buf.sub(off, len);
        let recvs = ahead.take();
        if kids > 0 && k + 1 < pieces.len() {
            ahead = Some(post(cx, k + 1)?);
        }
        let acc = match tree.parent {
            None => mine,
            Some(parent) if kids == 0 && !red.needs_prescale() => {
                direct_sends.push(cx.send(parent, mine)?);
                continue;
            }
            Some(_) => {
                if let Some(req) = pending_send[k % 2].take() {
                    cx.wait(req)?;
                }
                accs[k % 2].sub(0, len)
            }
        };
        // An inner rank's accumulator gets its own input with the first child's partial, in
        // one pass, unless the input must be scaled first.
        let mut needs_mine = tree.parent.is_some();
        if needs_mine && red.needs_prescale() {
            ctx::load_input(&red, acc, mine);
            needs_mine = false;
        }
        // Smallest subtree first, the order in which partials arrive: the children's lists
        // are largest first, and a rank whose subtree is larger finishes later. Waiting in list
        // order would leave every combine until the largest partial is in.
        for (i, req) in recvs.unwrap_or_default().into_iter().enumerate().rev() {
            cx.wait(req)?;
            let partial = landing(k, i, len);
            if needs_mine {
                ctx::fold(&red, acc, &[mine, partial]);
                needs_mine = false;
            } else {
                ctx::combine(&red, acc, partial);
            }
        }
        match tree.parent {
            Some(parent) => pending_send[k % 2] = Some(cx.send(parent, acc)?),
            None => ctx::finish(&red, acc),
        }
    }
    direct_sends.extend(pending_send.into_iter().flatten());
    cx.wait_all(&mut direct_sends)
}
