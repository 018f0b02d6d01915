//! Binomial-tree scatter for small blocks: the root sends each child, in one message, the blocks
//! of the child's whole subtree, and every rank passes on its children's parts the same way:
//! `log2 n` steps instead of the root's `n-1` sends.
//!
//! A rank holds its subtree's blocks in one staging chunk, so this needs equal blocks (as
//! scatter has) with `n x block <= chunk_bytes`. The root sends a leaf child's block straight
//! from its input and leaves receive straight into their output: only subtrees of several
//! blocks pass through staging.

use crate::algos::ctx::OpCtx;
use crate::algos::tree::{subtree, vrank, BinomialTree};
use crate::error::{Error, Result};
use crate::span::Span;

/// True when every block of `n` fits one staging chunk of `chunk_bytes` together.
pub fn applicable(n: usize, block: usize, chunk_bytes: usize) -> bool {
    n.saturating_mul(block) <= chunk_bytes
}

fn inapplicable(what: &str) -> Error {
    Error::invalid(
        "algo",
        format!("equal blocks that fit one staging chunk together for {what} tree"),
        "tree",
    )
}

/// Runs the tree scatter from `root`.
pub fn run(cx: &mut OpCtx<'_>, inputs: &[Span], output: Span, root: usize) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let b = output.len();
    let chunk = cx.staging.chunk_for(1);
    if !applicable(n, b, chunk) || (r == root && inputs.iter().any(|s| s.len() != b)) {
        return Err(inapplicable("scatter"));
    }
    let tree = BinomialTree::new(r, n, root);
    let vr = vrank(r, n, root);
    let slot = cx.staging.slot(0);
    match tree.parent {
        None => {}
        Some(parent) if tree.children.is_empty() => {
            let req = cx.recv(parent, output)?;
            return cx.wait(req);
        }
        Some(parent) => {
            let req = cx.recv(parent, slot.sub(0, subtree(vr, n) * b))?;
            cx.wait(req)?;
        }
    }
    // The block of relative rank `v` sits at `(v - vr) * b` in the slot. The root stages a
    // child's subtree just before sending it, and sends a leaf child's block straight from its
    // input (which lands straight in the leaf's output: on 2 ranks, direct's one message).
    let at_root = tree.parent.is_none();
    let mut sends = Vec::with_capacity(tree.children.len());
    for &c in &tree.children {
        let vc = vrank(c, n, root);
        let (first, blocks) = (vc - vr, subtree(vc, n));
        let part = if at_root && blocks == 1 {
            inputs[c]
        } else {
            if at_root {
                for v in first..first + blocks {
                    slot.sub(v * b, b).copy_from(&inputs[(v + root) % n]);
                }
            }
            slot.sub(first * b, blocks * b)
        };
        sends.push(cx.send(c, part)?);
    }
    // Its own block after the children's parts are on their way (sends only read the slot and
    // the root's other inputs).
    let own = if at_root {
        inputs[root]
    } else {
        slot.sub(0, b)
    };
    output.copy_from(&own);
    cx.wait_all(&mut sends)
}
