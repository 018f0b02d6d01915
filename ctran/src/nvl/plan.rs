//! How each collective maps onto one launch of the NVLink collective kernel.
//!
//! **Staged** (small messages, no per-op exchange): every rank copies its input into its own
//! arena half before the start barrier; after it, each rank *pulls* what it needs from peers'
//! arenas into its own outputs. Nobody writes another rank's memory, so no end barrier is
//! needed: all_reduce is one-shot (every rank reduces every peer's copy, in rank order, so the
//! results are bitwise equal).
//!
//! **Low-latency** (small all_reduces): every rank writes its input into every peer's LL
//! region as lines that carry their own flag, and reduces once every peer's lines of this
//! epoch are in its own region: no barrier, no fence, one crossing of NVLink (the LL kernel in
//! `nvl.cu` says why the halves are safe).
//!
//! **Direct** (large messages): ranks exchange the addresses of their buffers (IPC handles,
//! cached) and move data straight between user buffers: all_reduce is two-shot in one pass
//! (rank r reduces slice r of every input and stores the sum into slice r of every output;
//! no other rank touches slice r, so it is safe in place), all_gather and all_to_all push,
//! reduce_scatter pulls. An end barrier tells every rank that peers are done with its buffers.

use super::kernels::{
    op_code, CollParams, LlParams, Seg, Sync, LL_DATA_BYTES, LL_LINE_BYTES, MAX_BLOCKS, MAX_RANKS,
    MAX_SEGS,
};
use crate::error::{Error, Result};
use crate::{DataType, Op, ReduceOp, Span};

/// Which of the two ways an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Through the comm's arena (see the module doc).
    Staged,
    /// all_reduce through peers' LL regions.
    LowLatency,
    /// Between user buffers.
    Direct,
    /// all_reduce by copy engines, chunk by chunk ([`super::pipeline`]).
    Pipelined,
}

/// What a plan needs to know about the comm.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// This rank.
    pub rank: usize,
    /// Ranks of the comm.
    pub nranks: usize,
    /// Every rank's arena start as mapped here.
    pub arena: [u64; MAX_RANKS],
    /// Bytes of one arena half (the largest staged input).
    pub half: u64,
    /// Every rank's pipeline scratch as mapped here (the arena's tail).
    pub scratch: [u64; MAX_RANKS],
    /// Bytes of one rank's pipeline scratch.
    pub scratch_bytes: usize,
    /// Every rank's LL region as mapped here.
    pub ll: [u64; MAX_RANKS],
    /// Bytes of one source's lines in one half of an LL region (0: no region).
    pub ll_slot: u64,
}

/// Bytes of one source's lines in one half of an LL region for inputs of up to `max_bytes`
/// (0: none). At least one line per block of the largest grid, since every block owns a line.
pub fn ll_slot_bytes(max_bytes: usize) -> u64 {
    if max_bytes == 0 {
        return 0;
    }
    (max_bytes as u64)
        .div_ceil(LL_DATA_BYTES)
        .max(MAX_BLOCKS as u64)
        * LL_LINE_BYTES
}

/// Bytes of a rank's LL region: two halves of one slot per source.
pub fn ll_region_bytes(max_bytes: usize, nranks: usize) -> u64 {
    2 * nranks as u64 * ll_slot_bytes(max_bytes)
}

/// The low-latency plan of an all_reduce (see the module doc); the caller checked that its
/// input fits the region (`CTRAN_NVL_LL_MAX_BYTES`).
pub fn low_latency(op: &Op, l: &Layout, sync: Sync) -> Result<(DataType, LlParams)> {
    let Op::AllReduce { buf, dtype, op } = op else {
        return Err(Error::NotSupported(format!(
            "nvl: the low-latency path runs all_reduce only, not {}",
            op.name()
        )));
    };
    let r = reduction(sync, *dtype, *op, l.nranks)?;
    Ok((
        *dtype,
        LlParams {
            sync,
            src: addr(buf),
            dst: addr(buf),
            bytes: buf.len() as u64,
            area: l.ll[l.rank],
            peer_area: l.ll,
            half_bytes: l.nranks as u64 * l.ll_slot,
            slot_bytes: l.ll_slot,
            factor: r.factor,
            divisor: r.divisor,
            op: r.op,
            pad: 0,
        },
    ))
}

/// Bytes a rank stages for `op` in staged mode, when the op can be staged: the same number on
/// every rank, so the choice of mode agrees across ranks.
pub fn staged_bytes(op: &Op, uniform: bool) -> Option<usize> {
    match op {
        Op::AllReduce { buf, .. } | Op::Reduce { buf, .. } | Op::Broadcast { buf, .. } => {
            Some(buf.len())
        }
        Op::AllGather { outputs, .. } => equal_len(outputs),
        Op::ReduceScatter { inputs, .. } => equal_len(inputs).map(|l| l * inputs.len()),
        Op::AllToAll { inputs, .. } if uniform => equal_len(inputs).map(|l| l * inputs.len()),
        // Root's blocks are all the output's size (torchcomms takes equal tensors); every
        // rank knows that size, so all agree.
        Op::Scatter { inputs, output, .. } => {
            equal_len(inputs).filter(|&l| inputs.is_empty() || l == output.len())?;
            Some(output.len() * MAX_RANKS)
        }
        Op::Gather { input, outputs, .. } => {
            equal_len(outputs).filter(|&l| outputs.is_empty() || l == input.len())?;
            Some(input.len())
        }
        Op::Barrier => Some(0),
        _ => None,
    }
}

fn equal_len(spans: &[Span]) -> Option<usize> {
    let l = spans.first().map_or(0, Span::len);
    spans.iter().all(|s| s.len() == l).then_some(l)
}

fn seg(src: u64, dst: u64, len: usize) -> Seg {
    Seg {
        src,
        dst,
        len: len as u64,
        src_arena: 0,
        dst_arena: 0,
    }
}

fn addr(s: &Span) -> u64 {
    s.addr() as u64
}

/// Sets the reduction operator of `p` for `dtype` over `nranks` inputs.
fn set_op(p: &mut CollParams, dtype: DataType, op: ReduceOp, nranks: usize) -> Result<()> {
    op.check_dtype(dtype)?;
    p.op = match op {
        ReduceOp::Sum => op_code::SUM,
        ReduceOp::Product => op_code::PROD,
        ReduceOp::Min => op_code::MIN,
        ReduceOp::Max => op_code::MAX,
        ReduceOp::BAnd => op_code::BAND,
        ReduceOp::BOr => op_code::BOR,
        ReduceOp::BXor => op_code::BXOR,
        ReduceOp::Avg => op_code::AVG,
        ReduceOp::PremulSum { .. } => op_code::PREMUL,
    };
    match op {
        ReduceOp::PremulSum { factor } => p.factor = factor,
        ReduceOp::Avg if dtype.is_float() => p.factor = 1.0 / nranks as f64,
        ReduceOp::Avg => p.divisor = nranks as i64,
        _ => {}
    }
    Ok(())
}

/// A reduction of `dtype` by `op` over `nranks` inputs, with no data yet: the operator fields
/// of the kernels' parameters.
pub fn reduction(sync: Sync, dtype: DataType, op: ReduceOp, nranks: usize) -> Result<CollParams> {
    let mut p = CollParams::new(sync);
    set_op(&mut p, dtype, op, nranks)?;
    Ok(p)
}

fn push(list: &mut [Seg; MAX_SEGS], n: &mut u32, s: Seg) -> Result<()> {
    let i = *n as usize;
    if i >= MAX_SEGS {
        return Err(Error::NotSupported(format!(
            "nvl: more than {MAX_SEGS} copies in one operation"
        )));
    }
    if s.len > 0 && !(s.src == s.dst && s.src_arena == s.dst_arena) {
        list[i] = s;
        *n += 1;
    }
    Ok(())
}

/// The peers in the order rank `r` of `n` visits them: itself first, then r+1, r+2, ...
/// The kernel runs a plan's copies one after the other with all its blocks, so in step k every
/// rank talks to rank r+k: a permutation, where the same order on every rank would have them
/// all write to (or read from) rank k at once.
fn rotated(r: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |k| (r + k) % n)
}

/// The staged plan of `op`: the element type the kernel runs with, and its parameters.
pub fn staged(op: &Op, l: &Layout, sync: Sync) -> Result<(DataType, CollParams)> {
    let mut p = CollParams::new(sync);
    p.half_bytes = l.half;
    let r = l.rank;
    let mine = l.arena[r];
    let to_arena = |src: u64, off: usize, len: usize| Seg {
        dst_arena: 1,
        ..seg(src, mine + off as u64, len)
    };
    let from_arena = |peer: usize, off: usize, dst: u64, len: usize| Seg {
        src_arena: 1,
        ..seg(l.arena[peer] + off as u64, dst, len)
    };
    let mut dtype = DataType::U8;
    match op {
        Op::AllReduce { buf, dtype: d, op } => {
            dtype = *d;
            push(&mut p.pre, &mut p.npre, to_arena(addr(buf), 0, buf.len()))?;
            reduce_all_arenas(&mut p, l, 0, addr(buf), buf.len(), *d, *op)?;
        }
        Op::Reduce {
            buf,
            dtype: d,
            op,
            root,
        } => {
            dtype = *d;
            push(&mut p.pre, &mut p.npre, to_arena(addr(buf), 0, buf.len()))?;
            if r == *root {
                reduce_all_arenas(&mut p, l, 0, addr(buf), buf.len(), *d, *op)?;
            }
        }
        Op::Broadcast { buf, root } => {
            if r == *root {
                push(&mut p.pre, &mut p.npre, to_arena(addr(buf), 0, buf.len()))?;
            } else {
                push(
                    &mut p.copy,
                    &mut p.ncopy,
                    from_arena(*root, 0, addr(buf), buf.len()),
                )?;
            }
        }
        Op::AllGather { input, outputs } => {
            push(
                &mut p.pre,
                &mut p.npre,
                to_arena(addr(input), 0, input.len()),
            )?;
            for q in rotated(r, outputs.len()) {
                let out = &outputs[q];
                let s = if q == r {
                    seg(addr(input), addr(out), out.len())
                } else {
                    from_arena(q, 0, addr(out), out.len())
                };
                push(&mut p.copy, &mut p.ncopy, s)?;
            }
        }
        Op::ReduceScatter {
            inputs,
            output,
            dtype: d,
            op,
        } => {
            dtype = *d;
            let len = output.len();
            for (q, input) in inputs.iter().enumerate() {
                push(&mut p.pre, &mut p.npre, to_arena(addr(input), q * len, len))?;
            }
            reduce_all_arenas(&mut p, l, r * len, addr(output), len, *d, *op)?;
        }
        Op::AllToAll { inputs, outputs } => {
            let len = inputs.first().map_or(0, Span::len);
            for (q, input) in inputs.iter().enumerate() {
                push(&mut p.pre, &mut p.npre, to_arena(addr(input), q * len, len))?;
            }
            for q in rotated(r, outputs.len()) {
                let out = &outputs[q];
                let s = if q == r {
                    seg(addr(&inputs[r]), addr(out), out.len())
                } else {
                    from_arena(q, r * len, addr(out), out.len())
                };
                push(&mut p.copy, &mut p.ncopy, s)?;
            }
        }
        Op::Scatter {
            inputs,
            output,
            root,
        } => {
            let len = output.len();
            if r == *root {
                for (q, input) in inputs.iter().enumerate() {
                    push(&mut p.pre, &mut p.npre, to_arena(addr(input), q * len, len))?;
                }
                push(
                    &mut p.copy,
                    &mut p.ncopy,
                    seg(addr(&inputs[r]), addr(output), len),
                )?;
            } else {
                push(
                    &mut p.copy,
                    &mut p.ncopy,
                    from_arena(*root, r * len, addr(output), len),
                )?;
            }
        }
        Op::Gather {
            input,
            outputs,
            root,
        } => {
            push(
                &mut p.pre,
                &mut p.npre,
                to_arena(addr(input), 0, input.len()),
            )?;
            if r == *root {
                for (q, out) in outputs.iter().enumerate() {
                    let s = if q == r {
                        seg(addr(input), addr(out), out.len())
                    } else {
                        from_arena(q, 0, addr(out), out.len())
                    };
                    push(&mut p.copy, &mut p.ncopy, s)?;
                }
            }
        }
        Op::Barrier => {}
        other => {
            return Err(Error::NotSupported(format!(
                "nvl: {} has no staged form",
                other.name()
            )))
        }
    }
    Ok((dtype, p))
}

/// Reduction of `len` bytes at offset `off` of every rank's arena into `dst`.
fn reduce_all_arenas(
    p: &mut CollParams,
    l: &Layout,
    off: usize,
    dst: u64,
    len: usize,
    dtype: DataType,
    op: ReduceOp,
) -> Result<()> {
    set_op(p, dtype, op, l.nranks)?;
    for q in 0..l.nranks {
        p.rsrc[q] = l.arena[q] + off as u64;
    }
    p.rsrc_arena = (1u32 << l.nranks) - 1;
    p.nsrc = l.nranks as u32;
    p.rdst[0] = dst;
    p.ndst = 1;
    p.rcount = (len / dtype.size_bytes()) as u64;
    Ok(())
}

/// The buffers a rank exposes to peers for `op` in direct mode, in a fixed order that
/// [`direct`] reads peers' lists by.
pub fn exposed(op: &Op) -> Vec<Span> {
    match op {
        Op::AllReduce { buf, .. } | Op::Reduce { buf, .. } | Op::Broadcast { buf, .. } => {
            vec![*buf]
        }
        Op::AllGather { outputs, .. } => outputs.clone(),
        Op::ReduceScatter { inputs, .. } => inputs.clone(),
        Op::AllToAll { outputs, .. } => outputs.clone(),
        Op::Scatter { output, .. } => vec![*output],
        Op::Gather { outputs, .. } => outputs.clone(),
        _ => Vec::new(),
    }
}

/// Slice `q` of a two-shot all_reduce over `bytes`: (offset, length), cut on 16-byte bounds so
/// the kernel moves whole vectors.
pub fn two_shot_slice(bytes: usize, nranks: usize, q: usize) -> (usize, usize) {
    let per = bytes.div_ceil(nranks).div_ceil(16) * 16;
    let lo = (per * q).min(bytes);
    let hi = (per * (q + 1)).min(bytes);
    (lo, hi - lo)
}

/// The direct plan of `op`; `peer(q, i)` is the address here of rank q's i-th exposed buffer
/// (this rank's own for q == rank) and `peer_len(q, i)` its length.
pub fn direct(
    op: &Op,
    l: &Layout,
    sync: Sync,
    peer: &dyn Fn(usize, usize) -> u64,
    peer_len: &dyn Fn(usize, usize) -> usize,
) -> Result<(DataType, CollParams)> {
    let mut p = CollParams::new(sync);
    p.end_barrier = 1;
    let (r, n) = (l.rank, l.nranks);
    let mut dtype = DataType::U8;
    let size_mismatch = |what: &str, q: usize, mine: usize, theirs: usize| {
        Error::invalid(
            format!("{} {what}", op.name()),
            format!("{theirs} bytes, as rank {q} expects"),
            format!("{mine} bytes on rank {r}"),
        )
    };
    // A copy of `src` into the buffer rank q exposed as `(dst, theirs)`, which must be as long.
    let copy_to = |p: &mut CollParams, what: &str, q: usize, src: &Span, dst: u64, theirs| {
        if theirs != src.len() {
            return Err(size_mismatch(what, q, src.len(), theirs));
        }
        push(&mut p.copy, &mut p.ncopy, seg(addr(src), dst, src.len()))
    };
    match op {
        Op::AllReduce { buf, dtype: d, op } => {
            dtype = *d;
            set_op(&mut p, *d, *op, n)?;
            // Every rank sees every size, so a difference fails on all of them alike.
            if let Some(q) = (0..n).find(|&q| peer_len(q, 0) != buf.len()) {
                return Err(size_mismatch("tensor", q, buf.len(), peer_len(q, 0)));
            }
            let (off, len) = two_shot_slice(buf.len(), n, r);
            for q in 0..n {
                p.rsrc[q] = peer(q, 0) + off as u64;
                p.rdst[q] = peer(q, 0) + off as u64;
            }
            p.nsrc = n as u32;
            p.ndst = n as u32;
            p.rcount = (len / d.size_bytes()) as u64;
        }
        Op::Reduce {
            buf,
            dtype: d,
            op,
            root,
        } => {
            dtype = *d;
            if r == *root {
                set_op(&mut p, *d, *op, n)?;
                for q in 0..n {
                    p.rsrc[q] = peer(q, 0);
                }
                p.rdst[0] = addr(buf);
                p.nsrc = n as u32;
                p.ndst = 1;
                p.rcount = (buf.len() / d.size_bytes()) as u64;
            }
        }
        Op::Broadcast { buf, root } if n > 2 => {
            // The root pushing the whole buffer to every peer would send (n-1) x its size out
            // of one GPU. Instead non-root j reads slice j of the root's buffer once and writes
            // it to every non-root (a one-source "sum" of bytes): the root sends each byte
            // once, like a pipelined ring, and no GPU sends more than the buffer.
            if r != *root {
                let j = (r + n - root) % n - 1;
                let (off, len) = two_shot_slice(buf.len(), n - 1, j);
                dtype = DataType::U8;
                set_op(&mut p, DataType::U8, ReduceOp::Sum, 1)?;
                p.rsrc[0] = peer(*root, 0) + off as u64;
                p.nsrc = 1;
                for (k, q) in rotated(r, n).filter(|q| q != root).enumerate() {
                    p.rdst[k] = peer(q, 0) + off as u64;
                }
                p.ndst = (n - 1) as u32;
                p.rcount = len as u64;
            }
        }
        Op::Broadcast { buf, root } => {
            if r == *root {
                for q in (0..n).filter(|&q| q != r) {
                    push(
                        &mut p.copy,
                        &mut p.ncopy,
                        seg(addr(buf), peer(q, 0), buf.len()),
                    )?;
                }
            }
        }
        Op::AllGather { input, .. } => {
            for q in rotated(r, n) {
                copy_to(&mut p, "the input", q, input, peer(q, r), peer_len(q, r))?;
            }
        }
        Op::ReduceScatter {
            output,
            dtype: d,
            op,
            ..
        } => {
            dtype = *d;
            set_op(&mut p, *d, *op, n)?;
            for q in 0..n {
                let theirs = peer_len(q, r);
                if theirs != output.len() {
                    return Err(size_mismatch("the output", q, output.len(), theirs));
                }
                p.rsrc[q] = peer(q, r);
            }
            p.rdst[0] = addr(output);
            p.nsrc = n as u32;
            p.ndst = 1;
            p.rcount = (output.len() / d.size_bytes()) as u64;
        }
        Op::AllToAll { inputs, .. } => {
            for q in rotated(r, inputs.len()) {
                copy_to(
                    &mut p,
                    "input block",
                    q,
                    &inputs[q],
                    peer(q, r),
                    peer_len(q, r),
                )?;
            }
        }
        Op::Scatter { inputs, root, .. } => {
            if r == *root {
                for (q, input) in inputs.iter().enumerate() {
                    copy_to(&mut p, "input block", q, input, peer(q, 0), peer_len(q, 0))?;
                }
            }
        }
        Op::Gather { input, root, .. } => {
            copy_to(
                &mut p,
                "the input",
                *root,
                input,
                peer(*root, r),
                peer_len(*root, r),
            )?;
        }
        Op::Barrier => p.end_barrier = 0,
        other => {
            return Err(Error::NotSupported(format!(
                "nvl: {} is not a collective",
                other.name()
            )))
        }
    }
    Ok((dtype, p))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span at a made-up address: plans only read addresses and lengths.
    fn span(addr: u64, len: usize) -> Span {
        // SAFETY: never dereferenced.
        unsafe { Span::from_raw(addr as usize as *mut u8, len) }
    }

    fn layout(rank: usize, nranks: usize) -> Layout {
        Layout {
            rank,
            nranks,
            arena: [0; MAX_RANKS],
            half: 0,
            scratch: [0; MAX_RANKS],
            scratch_bytes: 0,
            ll: [0; MAX_RANKS],
            ll_slot: 0,
        }
    }

    #[test]
    fn ll_regions_hold_a_line_per_block_and_two_halves_per_source() {
        assert_eq!(ll_slot_bytes(0), 0);
        assert_eq!(ll_region_bytes(0, 8), 0);
        // 8 bytes is one line of data, but every block of the largest grid owns a line.
        assert_eq!(ll_slot_bytes(8), MAX_BLOCKS as u64 * LL_LINE_BYTES);
        // 256 KiB: 32768 lines of 16 bytes; odd sizes round up to a whole line.
        assert_eq!(ll_slot_bytes(256 << 10), 32768 * 16);
        assert_eq!(ll_slot_bytes((256 << 10) + 1), 32769 * 16);
        assert_eq!(ll_region_bytes(256 << 10, 4), 2 * 4 * 32768 * 16);
    }

    #[test]
    fn the_low_latency_plan_points_at_every_ranks_region_and_carries_the_operator() {
        let mut l = layout(2, 4);
        for q in 0..4 {
            l.ll[q] = 0x1000 * (q as u64 + 1);
        }
        l.ll_slot = 4096;
        let op = Op::AllReduce {
            buf: span(0x7000, 24),
            dtype: DataType::F32,
            op: ReduceOp::Avg,
        };
        let (dtype, p) = low_latency(&op, &l, Sync::default()).expect("plan");
        assert_eq!(dtype, DataType::F32);
        assert_eq!((p.src, p.dst, p.bytes), (0x7000, 0x7000, 24));
        assert_eq!(p.area, 0x3000);
        assert_eq!(p.peer_area[..4], [0x1000, 0x2000, 0x3000, 0x4000]);
        assert_eq!((p.half_bytes, p.slot_bytes), (4 * 4096, 4096));
        assert_eq!((p.op, p.factor), (op_code::AVG, 0.25));
        let int_avg = Op::AllReduce {
            buf: span(0x7000, 24),
            dtype: DataType::I32,
            op: ReduceOp::Avg,
        };
        let (_, p) = low_latency(&int_avg, &l, Sync::default()).expect("plan");
        assert_eq!(p.divisor, 4);
        let bcast = Op::Broadcast {
            buf: span(0x7000, 24),
            root: 0,
        };
        let err = low_latency(&bcast, &l, Sync::default()).unwrap_err();
        assert!(err.to_string().contains("all_reduce only"), "{err}");
    }

    /// Where rank q's i-th exposed buffer sits in the tests: 1 MiB apart per buffer.
    fn peer_at(q: usize, i: usize) -> u64 {
        0x1000_0000 * (q as u64 + 1) + 0x10_0000 * i as u64
    }

    #[test]
    fn direct_broadcast_on_four_ranks_reads_each_slice_of_the_root_once() {
        let (n, root, len) = (4, 1, 1000);
        let mut covered = Vec::new();
        for r in 0..n {
            let op = Op::Broadcast {
                buf: span(peer_at(r, 0), len),
                root,
            };
            let (_, p) =
                direct(&op, &layout(r, n), Sync::default(), &peer_at, &|_, _| len).expect("plan");
            if r == root {
                assert_eq!((p.nsrc, p.ndst, p.ncopy), (0, 0, 0), "the root only waits");
                continue;
            }
            assert_eq!((p.nsrc, p.ndst), (1, 3));
            let off = p.rsrc[0] - peer_at(root, 0);
            let mut dsts: Vec<u64> = p.rdst[..3].iter().map(|d| d - off).collect();
            dsts.sort_unstable();
            assert_eq!(dsts, vec![peer_at(0, 0), peer_at(2, 0), peer_at(3, 0)]);
            assert_eq!(p.rdst[0], peer_at(r, 0) + off, "its own buffer first");
            covered.push((off, p.rcount));
        }
        covered.sort_unstable();
        let mut next = 0;
        for (off, count) in covered {
            assert_eq!(off, next);
            next += count;
        }
        assert_eq!(next, len as u64, "the slices cover the buffer once");
    }

    #[test]
    fn direct_all_reduce_of_another_size_than_a_peer_fails_naming_both() {
        let op = Op::AllReduce {
            buf: span(peer_at(0, 0), 4096),
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        let len = |q: usize, _| if q == 2 { 8192 } else { 4096 };
        let err = direct(&op, &layout(0, 3), Sync::default(), &peer_at, &len).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("8192 bytes, as rank 2") && msg.contains("4096 bytes on rank 0"),
            "{msg}"
        );
        let same = |_, _| 4096;
        assert!(direct(&op, &layout(0, 3), Sync::default(), &peer_at, &same).is_ok());
    }

    #[test]
    fn direct_all_gather_writes_to_peers_in_rotated_order() {
        let (n, len) = (4, 64);
        for r in 0..n {
            let op = Op::AllGather {
                input: span(0x9000_0000, len),
                outputs: (0..n).map(|q| span(peer_at(r, q), len)).collect(),
            };
            let (_, p) =
                direct(&op, &layout(r, n), Sync::default(), &peer_at, &|_, _| len).expect("plan");
            let order: Vec<u64> = p.copy[..p.ncopy as usize].iter().map(|c| c.dst).collect();
            let want: Vec<u64> = (0..n).map(|k| peer_at((r + k) % n, r)).collect();
            assert_eq!(order, want, "rank {r}: step k writes to rank r + k");
        }
    }

    #[test]
    fn two_shot_slices_cover_the_buffer_on_vector_bounds() {
        for bytes in [0usize, 1, 15, 16, 17, 1000, 4096, 1 << 20, (1 << 20) + 4] {
            for n in 1..=8 {
                let mut next = 0;
                for q in 0..n {
                    let (off, len) = two_shot_slice(bytes, n, q);
                    assert_eq!(off, next, "bytes {bytes} n {n} q {q}");
                    if len > 0 {
                        assert_eq!(off % 16, 0);
                    }
                    next = off + len;
                }
                assert_eq!(next, bytes);
            }
        }
    }

    #[test]
    fn staged_sizes_agree_only_for_equal_blocks() {
        let mut a = vec![0u8; 64];
        // SAFETY: spans over a live local buffer, only measured here.
        let mut s = |o: usize, l: usize| unsafe { Span::from_raw(a.as_mut_ptr().add(o), l) };
        let equal = Op::AllGather {
            input: s(0, 8),
            outputs: vec![s(0, 8), s(8, 8)],
        };
        assert_eq!(staged_bytes(&equal, false), Some(8));
        let ragged = Op::AllGather {
            input: s(0, 8),
            outputs: vec![s(0, 8), s(8, 4)],
        };
        assert_eq!(staged_bytes(&ragged, false), None);
        let a2a = Op::AllToAll {
            inputs: vec![s(0, 8), s(8, 8)],
            outputs: vec![s(16, 8), s(24, 8)],
        };
        assert_eq!(staged_bytes(&a2a, false), None);
        assert_eq!(staged_bytes(&a2a, true), Some(16));
    }
}
