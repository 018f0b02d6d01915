//! The collectives that only move data: all_gather, broadcast and all_to_all.

use crate::algos::ctx::chunks;
use crate::comm::stable_hash::StableHasher;
use crate::span::Span;

use super::*;

/// all_gather (blocks may differ in size): `outputs[j]` receives rank `j`'s input.
pub fn all_gather(cx: &mut ShmCtx<'_>, input: Span, outputs: &[Span]) -> Result<(), ShmFail> {
    let me = cx.me();
    let lens: Vec<usize> = outputs.iter().map(Span::len).collect();
    let d = Desc {
        kind: Kind::AllGather,
        bytes: input.len(),
        args: StableHasher::new().usizes(&lens).finish(),
    };
    let expect = |j: usize| lens[j];
    if cx.use_cma(lens.iter().sum()) {
        cx.publish(d, &[input]);
        cx.barrier()?;
        cx.check(d, expect)?;
        outputs[me].copy_from(&input);
        for j in cx.peers().collect::<Vec<_>>() {
            cx.read(j, 0, 0, outputs[j])?;
        }
        return cx.barrier();
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    let cap = cx.capacity();
    for off in (0..longest).step_by(cap) {
        let piece = |s: &Span| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(cap));
        let mine = piece(&input);
        cx.buf(me).copy_from(&mine);
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, expect)?;
        }
        // Own block first, then peers in `peers` order (every rank reading the same peer's
        // buffer at once would make its core serve them all).
        for j in std::iter::once(me).chain(cx.peers()) {
            let dst = piece(&outputs[j]);
            dst.copy_from(&cx.buf(j).sub(0, dst.len()));
        }
        cx.next_round();
    }
    Ok(())
}

/// broadcast of `root`'s `buf` (`root` is a local index).
pub fn broadcast(cx: &mut ShmCtx<'_>, buf: Span, root: usize) -> Result<(), ShmFail> {
    let me = cx.me();
    let d = Desc {
        kind: Kind::Broadcast,
        bytes: buf.len(),
        args: StableHasher::new().u64(root as u64).finish(),
    };
    // Lanes of the peer reading the root's pages at once contend as more ranks do (see
    // `use_cma`): cut into lanes, a broadcast copies through the shared buffers.
    if cx.parts == 1 && cx.use_cma(buf.len()) {
        cx.publish(d, &[buf]);
        cx.barrier()?;
        cx.check(d, |_| buf.len())?;
        if me != root {
            cx.read(root, 0, 0, buf)?;
        }
        return cx.barrier();
    }
    for (off, len) in chunks(buf.len(), cx.capacity()) {
        if me == root {
            cx.buf(me).copy_from(&buf.sub(off, len));
        }
        if off == 0 {
            cx.publish(d, &[]);
        }
        cx.barrier()?;
        if off == 0 {
            cx.check(d, |_| buf.len())?;
        }
        if me != root {
            buf.sub(off, len).copy_from(&cx.buf(root).sub(0, len));
        }
        cx.next_round();
    }
    Ok(())
}

/// all_to_all by cross-memory attach: `outputs[j]` receives rank `j`'s `inputs[me]`, read
/// straight from rank `j`'s memory.
pub fn all_to_all(cx: &mut ShmCtx<'_>, inputs: &[Span], outputs: &[Span]) -> Result<(), ShmFail> {
    all_to_all_publish(cx, inputs)?;
    all_to_all_read(cx, inputs, outputs, outputs)
}

/// The first half of an all_to_all: publishes this rank's blocks and its total, and returns
/// the bytes all ranks together send (each rank's total may differ), which every rank then
/// knows alike: enough to agree on cutting the rest into lanes.
pub(super) fn all_to_all_publish(cx: &mut ShmCtx<'_>, inputs: &[Span]) -> Result<usize, ShmFail> {
    let d = Desc {
        kind: Kind::AllToAll,
        bytes: inputs.iter().map(Span::len).sum(),
        args: 0,
    };
    cx.publish(d, inputs);
    cx.barrier()?;
    let totals: Vec<usize> = (0..cx.n())
        .map(|j| {
            if j == cx.me() {
                d.bytes
            } else {
                cx.peer_bytes(j)
            }
        })
        .collect();
    cx.check(d, |j| totals[j])?;
    Ok(totals.iter().sum())
}

/// The second half: reads the first `parts[j].len()` bytes of every peer's published block for
/// this rank into `parts[j]` (all of `outputs[j]`, or this lane's share of it), after checking
/// that the peer's block is as long as `outputs[j]`; then waits until every peer has read this
/// rank's blocks.
pub(super) fn all_to_all_read(
    cx: &mut ShmCtx<'_>,
    inputs: &[Span],
    outputs: &[Span],
    parts: &[Span],
) -> Result<(), ShmFail> {
    let me = cx.me();
    parts[me].copy_from(&inputs[me].sub(0, parts[me].len()));
    // Peers in `peers` order: each process is read by one rank at a time (all reading the same
    // one contend in its page tables).
    for j in cx.peers().collect::<Vec<_>>() {
        let out = &outputs[j];
        let (_, len) = cx.peer_block(j, me);
        if len != out.len() {
            return Err(ShmFail::Mismatch {
                peer: cx.global(j),
                detail: format!(
                    "all_to_all sizes disagree: this rank expects {} bytes from the peer, \
                     the peer sends {len}",
                    out.len()
                ),
            });
        }
        cx.read(j, me, 0, parts[j])?;
    }
    cx.barrier()
}

/// all_to_all through the shared buffers: `outputs[j]` receives rank `j`'s `inputs[me]`. Each
/// round carries a piece of every block, side by side in the buffer (as reduce_scatter's):
/// a rank copies its pieces for every peer in, and after the round's barrier copies out the
/// pieces every peer left there for it. Two copies, both at memory speed, where cross-memory
/// reads (one copy) ran at a fifth of it with 8 ranks reading each other's pages at once.
pub(super) fn all_to_all_slots(
    cx: &mut ShmCtx<'_>,
    inputs: &[Span],
    outputs: &[Span],
) -> Result<(), ShmFail> {
    let (n, me) = (cx.n(), cx.me());
    let d = Desc {
        kind: Kind::AllToAll,
        bytes: inputs.iter().map(Span::len).sum(),
        args: 0,
    };
    if outputs[me].len() != inputs[me].len() {
        return Err(ShmFail::Mismatch {
            peer: cx.global(me),
            detail: format!(
                "all_to_all sizes disagree: this rank sends itself {} bytes into {}",
                inputs[me].len(),
                outputs[me].len()
            ),
        });
    }
    outputs[me].copy_from(&inputs[me]);
    // Whole cache lines per piece where the buffer allows.
    let per = cx.capacity() / n;
    let cap = if per >= 64 { per / 64 * 64 } else { per.max(1) };
    let piece =
        |s: &Span, off: usize| s.sub(off.min(s.len()), s.len().saturating_sub(off).min(cap));
    // Rounds run until the longest block of any rank is through (known after the first).
    let mut longest = 0;
    let mut off = 0;
    loop {
        for j in cx.peers().collect::<Vec<_>>() {
            let src = piece(&inputs[j], off);
            cx.buf(me).sub(j * cap, src.len()).copy_from(&src);
        }
        if off == 0 {
            cx.publish(d, inputs);
        }
        cx.barrier()?;
        if off == 0 {
            let totals: Vec<usize> = (0..n)
                .map(|j| if j == me { d.bytes } else { cx.peer_bytes(j) })
                .collect();
            cx.check(d, |j| totals[j])?;
            for j in cx.peers() {
                let (_, len) = cx.peer_block(j, me);
                if len != outputs[j].len() {
                    return Err(ShmFail::Mismatch {
                        peer: cx.global(j),
                        detail: format!(
                            "all_to_all sizes disagree: this rank expects {} bytes from the \
                             peer, the peer sends {len}",
                            outputs[j].len()
                        ),
                    });
                }
            }
            longest = (0..n)
                .flat_map(|i| (0..n).map(move |k| (i, k)))
                .map(|(i, k)| {
                    if i == me {
                        inputs[k].len()
                    } else {
                        cx.peer_block(i, k).1
                    }
                })
                .max()
                .unwrap_or(0);
        }
        for j in cx.peers().collect::<Vec<_>>() {
            let dst = piece(&outputs[j], off);
            dst.copy_from(&cx.buf(j).sub(me * cap, dst.len()));
        }
        cx.next_round();
        off = off.saturating_add(cap);
        if off >= longest {
            return Ok(());
        }
    }
}
