//! Binomial-tree reduce, chunked: each rank reduces its children's partials for one chunk and
//! passes the result to its parent, so memory stays at a few chunks whatever the message size,
//! and non-root buffers are never written.
//!
//! Receives from the children run one chunk ahead of the reduction; the root reduces straight
//! into its buffer, a leaf whose input needs no scaling sends straight from its buffer, and an
//! inner rank combines its input with its first child's partial into staging in one pass.
//!
//! [`run_all_reduce`] sends every chunk's result back down the same tree as soon as the root
//! has it, while later chunks are still on their way up: `2 log2 n + chunks - 1` steps, where a
//! reduce followed by a broadcast takes `2 (log2 n + chunks - 1)`, and on a host whose ranks
//! have a core each both directions of every link carry data at once.

use std::collections::VecDeque;

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
    reduce(cx, buf, dtype, op, root, None)
}

/// Runs the tree all_reduce of `buf` in place: the reduce onto `root`, each chunk's result
/// broadcast from it down the same tree as soon as it is complete.
pub fn run_all_reduce(
    cx: &mut OpCtx<'_>,
    buf: Span,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
) -> Result<()> {
    let mut down = Down::new(BinomialTree::new(cx.rank, cx.size, root).children);
    reduce(cx, buf, dtype, op, root, Some(&mut down))?;
    down.finish(cx)
}

/// The reduce; with `down`, every chunk's result also comes back down the tree into `buf`.
fn reduce(
    cx: &mut OpCtx<'_>,
    buf: Span,
    dtype: DataType,
    op: ReduceOp,
    root: usize,
    mut down: Option<&mut Down>,
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
        if let Some(down) = down.as_deref_mut() {
            down.forward_arrived(cx)?;
        }
        let mine = buf.sub(off, len);
        let recvs = ahead.take();
        if kids > 0 && k + 1 < pieces.len() {
            ahead = Some(post(cx, k + 1)?);
        }
        let acc = match tree.parent {
            None => mine,
            Some(parent) if kids == 0 && !red.needs_prescale() => {
                direct_sends.push(cx.send(parent, mine)?);
                if let Some(down) = down.as_deref_mut() {
                    // The result cannot arrive before the parent has all of this send, so
                    // `mine` is no longer read when it is written.
                    down.expect(cx, parent, mine)?;
                }
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
            Some(parent) => {
                pending_send[k % 2] = Some(cx.send(parent, acc)?);
                if let Some(down) = down.as_deref_mut() {
                    down.expect(cx, parent, mine)?;
                }
            }
            None => {
                ctx::finish(&red, acc);
                if let Some(down) = down.as_deref_mut() {
                    down.forward(cx, acc)?;
                }
            }
        }
    }
    direct_sends.extend(pending_send.into_iter().flatten());
    cx.wait_all(&mut direct_sends)
}

/// The way back down of the tree all_reduce: results that come from the parent, in chunk order,
/// and their forwarding to the children.
struct Down {
    children: Vec<usize>,
    /// Posted receives of results, oldest chunk first.
    arriving: VecDeque<(Span, ReqId)>,
    sends: Vec<ReqId>,
}

impl Down {
    fn new(children: Vec<usize>) -> Down {
        Down {
            children,
            arriving: VecDeque::new(),
            sends: Vec::new(),
        }
    }

    /// Posts the receive of a chunk's result from `parent` into `piece`.
    fn expect(&mut self, cx: &mut OpCtx<'_>, parent: usize, piece: Span) -> Result<()> {
        let req = cx.recv(parent, piece)?;
        self.arriving.push_back((piece, req));
        Ok(())
    }

    /// Sends a chunk's complete result on to every child.
    fn forward(&mut self, cx: &mut OpCtx<'_>, piece: Span) -> Result<()> {
        for &child in &self.children {
            self.sends.push(cx.send(child, piece)?);
        }
        Ok(())
    }

    /// Forwards the results that have arrived, in chunk order, without waiting for more.
    fn forward_arrived(&mut self, cx: &mut OpCtx<'_>) -> Result<()> {
        while let Some(&(piece, req)) = self.arriving.front() {
            if !cx.test(req)? {
                break;
            }
            self.arriving.pop_front();
            self.forward(cx, piece)?;
        }
        Ok(())
    }

    /// Waits for every result and forwards it, then for every send.
    fn finish(mut self, cx: &mut OpCtx<'_>) -> Result<()> {
        while let Some((piece, req)) = self.arriving.pop_front() {
            cx.wait(req)?;
            self.forward(cx, piece)?;
        }
        cx.wait_all(&mut self.sends)
    }
}
