//! Binomial-tree gather for small blocks: every rank collects its children's subtrees (one
//! message each) next to its own block and sends the lot to its parent in one message:
//! `log2 n` steps instead of the root's `n-1` receives.
//!
//! A rank holds its subtree's blocks in one staging chunk, so this needs equal blocks (as
//! gather has) with `n x block <= chunk_bytes`. Leaves send straight from their input and the
//! root receives a leaf child's block straight into its output: only subtrees of several blocks
//! pass through staging.

use crate::algos::ctx::OpCtx;
use crate::algos::scatter::tree::applicable;
use crate::algos::tree::{subtree, vrank, BinomialTree};
use crate::error::{Error, Result};
use crate::span::Span;

/// Runs the tree gather onto `root`.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span], root: usize) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let b = input.len();
    let chunk = cx.staging.chunk_for(1);
    if !applicable(n, b, chunk) || (r == root && outputs.iter().any(|s| s.len() != b)) {
        return Err(Error::invalid(
            "algo",
            "equal blocks that fit one staging chunk together for gather tree",
            "tree",
        ));
    }
    let tree = BinomialTree::new(r, n, root);
    let vr = vrank(r, n, root);
    if tree.children.is_empty() {
        // A leaf's subtree is its own block: it goes out straight from the input.
        return match tree.parent {
            Some(parent) => {
                let req = cx.send(parent, input)?;
                cx.wait(req)
            }
            None => {
                outputs[root].copy_from(&input);
                Ok(())
            }
        };
    }
    let slot = cx.staging.slot(0);
    // The block of relative rank `v` sits at `(v - vr) * b` in the slot; the root takes a leaf
    // child's block straight into its output, so on 2 ranks this is direct's one message.
    let at_root = tree.parent.is_none();
    let mut recvs = Vec::with_capacity(tree.children.len());
    let mut staged = Vec::with_capacity(tree.children.len());
    for &c in &tree.children {
        let vc = vrank(c, n, root);
        let blocks = subtree(vc, n);
        let dst = if at_root && blocks == 1 {
            outputs[c]
        } else {
            staged.push(vc - vr..vc - vr + blocks);
            slot.sub((vc - vr) * b, blocks * b)
        };
        recvs.push(cx.recv(c, dst)?);
    }
    match tree.parent {
        Some(parent) => {
            slot.sub(0, b).copy_from(&input);
            cx.wait_all(&mut recvs)?;
            let req = cx.send(parent, slot.sub(0, subtree(vr, n) * b))?;
            cx.wait(req)
        }
        None => {
            outputs[root].copy_from(&input);
            cx.wait_all(&mut recvs)?;
            for v in staged.into_iter().flatten() {
                outputs[(v + root) % n].copy_from(&slot.sub(v * b, b));
            }
            Ok(())
        }
    }
}
