//! Recursive-halving reduce_scatter: at each of `log2 p` steps a rank sends the half of the
//! blocks it still reduces that its partner keeps, and reduces the partner's copy of its own
//! half (partners at distance `p/2, p/4, ..., 1`), so `(p-1)/p` of the input moves per rank in
//! `log2 p` steps.
//!
//! Any rank count works through the standard fix-up ([`Fold`]): the even rank of each of the
//! first `n - p` pairs sends its partials to the odd one, which reduces for both and returns the
//! even rank's block at the end.
//!
//! Memory stays at two staging chunks: the blocks are processed in rounds of `chunk / n` bytes
//! per block (so a round of all blocks fits one chunk), each round running all the steps. That
//! needs `n x element size <= chunk_bytes`. Blocks may differ in size (reduce_scatter_v).

use crate::algos::ctx::{self, OpCtx};
use crate::algos::pipe::{Fold, Role};
use crate::error::{Error, Result};
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Bytes per block in one round, for `n` ranks and elements of `elem` bytes (0 when a round of
/// one element per block does not fit a staging chunk).
pub fn round_bytes(chunk_bytes: usize, n: usize, elem: usize) -> usize {
    (chunk_bytes / n.max(1) / elem) * elem
}

/// Runs the recursive-halving reduce_scatter; `inputs[j]` is this rank's contribution to rank
/// `j`.
pub fn run(
    cx: &mut OpCtx<'_>,
    inputs: &[Span],
    output: Span,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let es = dtype.size_bytes();
    if n == 1 {
        ctx::load_result(&red, output, inputs[0]);
        return Ok(());
    }
    let c = round_bytes(cx.staging.chunk_for(1), n, es);
    if c == 0 {
        return Err(Error::invalid(
            "algo",
            format!(
                "chunk_bytes of at least {} for recursive_halving on {n} ranks",
                n * es
            ),
            "recursive_halving",
        ));
    }
    let fold = Fold::new(n);
    let role = fold.role(r);
    let (acc, tmp) = (cx.staging.slot(0), cx.staging.slot(1));
    let longest = inputs.iter().map(Span::len).max().unwrap_or(0);
    for o in (0..longest).step_by(c) {
        let lens: Vec<usize> = inputs
            .iter()
            .map(|b| b.len().saturating_sub(o).min(c))
            .collect();
        let mut at = vec![0; n + 1];
        for j in 0..n {
            at[j + 1] = at[j] + lens[j];
            ctx::load_input(
                &red,
                acc.sub(at[j], lens[j]),
                inputs[j].sub(o.min(inputs[j].len()), lens[j]),
            );
        }
        let out = output.sub(o.min(output.len()), lens[r]);
        let (me, extra) = match role {
            Role::Extra { partner } => {
                cx.sendrecv(partner, acc.sub(0, at[n]), partner, out)?;
                continue;
            }
            Role::Active { new, extra } => (new, extra),
        };
        if let Some(e) = extra {
            let got = tmp.sub(0, at[n]);
            let req = cx.recv(e, got)?;
            cx.wait(req)?;
            ctx::combine(&red, acc.sub(0, at[n]), got);
        }
        // Bytes of the blocks new ranks `lo..hi` stand for.
        let range = |lo: usize, hi: usize| {
            let (s, e) = (at[fold.first(lo)], at[fold.first(hi)]);
            (s, e - s)
        };
        let (mut lo, mut hi) = (0, fold.p);
        let mut mask = fold.p / 2;
        while mask > 0 {
            let peer = fold.real(me ^ mask);
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if me & mask == 0 {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let (ko, kl) = range(keep.0, keep.1);
            let (go, gl) = range(give.0, give.1);
            cx.sendrecv(peer, acc.sub(go, gl), peer, tmp.sub(0, kl))?;
            ctx::combine(&red, acc.sub(ko, kl), tmp.sub(0, kl));
            (lo, hi) = keep;
            mask /= 2;
        }
        if let Some(e) = extra {
            let theirs = acc.sub(at[e], lens[e]);
            ctx::finish(&red, theirs);
            let req = cx.send(e, theirs)?;
            cx.wait(req)?;
        }
        let mine = acc.sub(at[r], lens[r]);
        ctx::finish(&red, mine);
        out.copy_from(&mine);
    }
    Ok(())
}
