//! Recursive-doubling all_gather: in round `k` each rank swaps everything it holds with the
//! partner whose rank differs in bit `k`, doubling what it holds: `log2 p` rounds, each moving a
//! contiguous run of blocks in rank order.
//!
//! Any rank count works through the standard fix-up ([`Fold`]): the even rank of each of the
//! first `n - p` pairs hands its block to the odd one, which gathers for both and returns the
//! full output at the end (one extra step and one extra full transfer for those pairs).
//! Runs of blocks are [`Stream`]s over the outputs, so blocks may differ in size
//! (all_gather_v) and no whole-message scratch is needed.

use crate::algos::ctx::OpCtx;
use crate::algos::pipe::{self, Fold, Role, Stream};
use crate::error::Result;
use crate::span::Span;

/// Runs the recursive-doubling all_gather; `outputs[i]` receives rank `i`'s input.
pub fn run(cx: &mut OpCtx<'_>, input: Span, outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    outputs[r].copy_from(&input);
    let chunk = cx.staging.chunk_for(1);
    let fold = Fold::new(n);
    let one = |i: usize| Stream::new([outputs[i]]);
    let all_but = |i: usize| {
        Stream::new(
            outputs
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, s)| *s),
        )
    };
    let (me, extra) = match fold.role(r) {
        Role::Extra { partner } => {
            pipe::exchange(cx, Some((partner, &one(r))), None, chunk, 0)?;
            return pipe::exchange(cx, None, Some((partner, &all_but(r))), chunk, 0);
        }
        Role::Active { new, extra } => (new, extra),
    };
    if let Some(e) = extra {
        pipe::exchange(cx, None, Some((e, &one(e))), chunk, 0)?;
    }
    // Blocks of the new ranks `lo..hi`, in rank order.
    let run_of =
        |lo: usize, hi: usize| Stream::new(outputs[fold.first(lo)..fold.first(hi)].iter().copied());
    let (mut lo, mut hi) = (me, me + 1);
    let mut mask = 1;
    while mask < fold.p {
        let peer = fold.real(me ^ mask);
        let w = hi - lo;
        let other = if me & mask == 0 {
            (hi, hi + w)
        } else {
            (lo - w, lo)
        };
        let (send, recv) = (run_of(lo, hi), run_of(other.0, other.1));
        pipe::exchange(cx, Some((peer, &send)), Some((peer, &recv)), chunk, 0)?;
        (lo, hi) = (lo.min(other.0), hi.max(other.1));
        mask *= 2;
    }
    if let Some(e) = extra {
        pipe::exchange(cx, Some((e, &all_but(e))), None, chunk, 0)?;
    }
    Ok(())
}
