//! Recursive halving-doubling all_reduce (Rabenseifner): a reduce-scatter by recursive halving
//! (at each of `log2 p` steps a rank swaps half of what it still reduces with a partner at
//! distance `p/2, p/4, ..., 1`) then an all-gather by recursive doubling, moving
//! `2 (p-1)/p` of the buffer per rank in `2 log2 p` steps: bandwidth-optimal with logarithmic
//! latency.
//!
//! Any rank count works through the standard fix-up ([`Fold`]): with `p` the largest power of
//! two not above `n`, the first `2 (n - p)` ranks pair up, the even one of each pair sends its
//! buffer to the odd one and waits, and gets the finished result from it at the end.
//!
//! Each segment is reduced by one rank and copied to the others, so every rank ends with
//! bitwise the same result. Partner data is received in staging chunks and reduced in place.
//! The last step of the halving and the first of the doubling swap the same segments with the
//! same partner and run as one (`reduce_and_return`): each reduced piece goes back at once.

use std::collections::VecDeque;

use crate::algos::ctx::{self, partition, OpCtx};
use crate::algos::pipe::{self, Fold, Join, Role};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::ReqId;
use crate::types::{DataType, ReduceOp};

/// Transfers in the recursive halving of `count` elements among `p` (a power of two) active
/// ranks; the doubling mirrors them. A transfer of an empty range is skipped, and below `p`
/// elements only the first `count` segments hold any: in the step at distance `m`, each aligned
/// run of `m` segments is handed to the `m` ranks that keep it, if it holds an element. From
/// `p` elements on, that is `p log2 p`.
pub fn halving_transfers(count: usize, p: usize) -> usize {
    let filled = count.min(p);
    std::iter::successors(Some(p / 2), |m| Some(m / 2))
        .take_while(|&m| m > 0)
        .map(|m| m * filled.div_ceil(m))
        .sum()
}

/// Runs the halving-doubling all_reduce in place on `buf`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, dtype: DataType, op: ReduceOp) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let es = dtype.size_bytes();
    ctx::prescale(&red, buf);
    if n == 1 {
        ctx::finish(&red, buf);
        return Ok(());
    }
    let chunk = cx.staging.chunk_for(es);
    let fold = Fold::new(n);
    let (me, extra) = match fold.role(r) {
        Role::Extra { partner } => {
            pipe::exchange_chunked(cx, Some((partner, buf)), None, chunk)?;
            return pipe::exchange_chunked(cx, None, Some((partner, buf)), chunk);
        }
        Role::Active { new, extra } => (new, extra),
    };
    if let Some(e) = extra {
        pipe::exchange_reduce(cx, &red, None, e, buf, Join::Partial, chunk, 0)?;
    }

    let p = fold.p;
    let segs = partition(buf.len() / es, p, es);
    let range = |lo: usize, hi: usize| {
        let start = segs[lo].0;
        let end = segs[hi - 1].0 + segs[hi - 1].1;
        buf.sub(start, end - start)
    };
    let (mut lo, mut hi) = (0, p);
    let mut mask = p / 2;
    while mask > 0 {
        let peer = fold.real(me ^ mask);
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if me & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let (keep_span, give_span) = (range(keep.0, keep.1), range(give.0, give.1));
        if mask == 1 {
            // The last halving step and the first doubling step swap the same two segments
            // with the same partner: each piece of the result goes back while it is in cache.
            reduce_and_return(cx, &red, peer, keep_span, give_span, chunk)?;
            break;
        }
        pipe::exchange_reduce(
            cx,
            &red,
            Some((peer, give_span)),
            peer,
            keep_span,
            Join::Partial,
            chunk,
            0,
        )?;
        (lo, hi) = keep;
        mask /= 2;
    }
    let mut mask = 2;
    while mask < p {
        let peer = fold.real(me ^ mask);
        let w = hi - lo;
        let other = if me & mask == 0 {
            (hi, hi + w)
        } else {
            (lo - w, lo)
        };
        pipe::exchange_chunked(
            cx,
            Some((peer, range(lo, hi))),
            Some((peer, range(other.0, other.1))),
            chunk,
        )?;
        (lo, hi) = (lo.min(other.0), hi.max(other.1));
        mask *= 2;
    }
    if let Some(e) = extra {
        pipe::exchange_chunked(cx, Some((e, buf)), None, chunk)?;
    }
    Ok(())
}

/// Pieces of the partner's raw data in flight ahead of the one being reduced, each in its own
/// staging slot.
const AHEAD: usize = 2;

/// The last step of the halving fused with the first of the doubling, between this rank and
/// `peer`: this rank reduces `keep` (the partner sends its partial of it) and the partner
/// `give`, and each sends back the finished pieces of its own. A piece of the result leaves as
/// soon as it is reduced, while the next ones are still arriving, instead of after the whole
/// segment: the segment is read once from memory instead of twice, and the link carries raw
/// pieces and results both ways at once.
///
/// Both ranks send in the order `give[0], give[1]`, then for each `k`: `result[k]` (if `keep`
/// has a piece `k`), `give[k + 2]` (if `give` has one), and post their receives in the order the
/// partner sends; the counts of pieces may differ by one where the segments differ by an
/// element. A piece of `give` is overwritten by the partner's result only after the partner
/// has received it in full, so the receive is posted without waiting for the send.
fn reduce_and_return(
    cx: &mut OpCtx<'_>,
    red: &Reducer,
    peer: usize,
    keep: Span,
    give: Span,
    chunk: usize,
) -> Result<()> {
    let slots: [Span; AHEAD] = std::array::from_fn(|i| cx.staging.slot(i));
    let kp: Vec<(usize, usize)> = ctx::chunks(keep.len(), chunk).collect();
    let gp: Vec<(usize, usize)> = ctx::chunks(give.len(), chunk).collect();
    let landing = |k: usize| slots[k % AHEAD].sub(0, kp[k].1);
    let mut partials: VecDeque<ReqId> = VecDeque::new();
    for k in 0..kp.len().min(AHEAD) {
        partials.push_back(cx.recv(peer, landing(k))?);
    }
    let mut sends = Vec::new();
    for &(off, len) in gp.iter().take(AHEAD) {
        sends.push(cx.send(peer, give.sub(off, len))?);
    }
    let mut results = Vec::new();
    for k in 0..kp.len().max(gp.len()) {
        // What the partner sends at its step `k`: the result of `give[k]` (its raw
        // `keep[k + 1]` is posted already), then its raw `keep[k + 2]`, below, into the slot
        // this step frees.
        if let Some(&(off, len)) = gp.get(k) {
            results.push(cx.recv(peer, give.sub(off, len))?);
        }
        if let Some(&(off, len)) = kp.get(k) {
            let req = partials
                .pop_front()
                .expect("a receive is posted for every piece");
            cx.wait(req)?;
            let piece = keep.sub(off, len);
            ctx::combine(red, piece, landing(k));
            ctx::finish(red, piece);
            sends.push(cx.send(peer, piece)?);
        }
        if let Some(&(off, len)) = gp.get(k + AHEAD) {
            sends.push(cx.send(peer, give.sub(off, len))?);
        }
        if k + AHEAD < kp.len() {
            partials.push_back(cx.recv(peer, landing(k + AHEAD))?);
        }
    }
    cx.wait_all(&mut results)?;
    cx.wait_all(&mut sends)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the non-empty transfers of the halving as `run` cuts the buffer: every rank
    /// starts with all `p` segments and at each distance hands its partner the half it gives.
    fn simulated(count: usize, p: usize) -> usize {
        let segs = partition(count, p, 1);
        let bytes = |lo: usize, hi: usize| segs[lo..hi].iter().map(|s| s.1).sum::<usize>();
        let mut held = vec![(0, p); p];
        let mut sent = 0;
        let mut mask = p / 2;
        while mask > 0 {
            for (me, range) in held.iter_mut().enumerate() {
                let (lo, hi) = *range;
                let mid = lo + (hi - lo) / 2;
                let (keep, give) = if me & mask == 0 {
                    ((lo, mid), (mid, hi))
                } else {
                    ((mid, hi), (lo, mid))
                };
                sent += usize::from(bytes(give.0, give.1) > 0);
                *range = keep;
            }
            mask /= 2;
        }
        sent
    }

    #[test]
    fn halving_transfers_skip_empty_segments() {
        for p in [1, 2, 4, 8, 16, 32] {
            for count in 0..3 * p + 2 {
                assert_eq!(
                    halving_transfers(count, p),
                    simulated(count, p),
                    "{count} elements on {p} ranks"
                );
            }
            let lp = p.trailing_zeros() as usize;
            assert_eq!(halving_transfers(p, p), p * lp, "{p} ranks, full");
        }
        assert_eq!(halving_transfers(2, 8), 8);
    }
}
