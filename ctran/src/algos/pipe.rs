//! Moving data in pieces, shared by the algorithms.
//!
//! Two rules keep peers in step over a two-sided, FIFO transport that matches message sizes
//! exactly:
//! - every transfer is framed in pieces of at most one staging chunk, cut from the start of the
//!   logical data (a span, or a [`Stream`] of blocks), so both sides derive the same framing
//!   from sizes they agree on, whatever the memory layout on either side;
//! - pieces to or from one peer are posted in order.
//!
//! Memory stays at a few staging slots whatever the message size: a piece that is contiguous in
//! the caller's memory moves directly, any other one is packed or unpacked through a slot.

use std::collections::VecDeque;

use crate::algos::ctx::{self, chunks, OpCtx};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::transport::ReqId;

/// Pieces a transfer keeps in flight ahead of the one being consumed.
const WINDOW: usize = 2;

/// A logical byte stream laid over a list of blocks (the blocks of a collective in the order an
/// algorithm moves them). Blocks that follow each other in memory are merged, so a stream over
/// views of one tensor moves without copies.
#[derive(Debug, Clone)]
pub struct Stream {
    /// (offset in the stream, memory) of each contiguous run.
    runs: Vec<(usize, Span)>,
    len: usize,
}

impl Stream {
    /// The stream made of `blocks`, in order.
    pub fn new(blocks: impl IntoIterator<Item = Span>) -> Stream {
        let mut runs: Vec<(usize, Span)> = Vec::new();
        let mut len = 0;
        for b in blocks {
            if b.is_empty() {
                continue;
            }
            if let Some((_, last)) = runs.last_mut() {
                if last.addr() + last.len() == b.addr() {
                    // SAFETY: `last` and `b` are each valid for their length under the span
                    // contract (the operation's owner keeps them alive and reserved for it), and
                    // `b` starts where `last` ends, so every byte of the union is valid too.
                    *last = unsafe { Span::from_raw(last.as_ptr(), last.len() + b.len()) };
                    len += b.len();
                    continue;
                }
            }
            runs.push((len, b));
            len += b.len();
        }
        Stream { runs, len }
    }

    /// Total bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the stream holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Index of the run holding stream offset `off` (< len).
    fn run_at(&self, off: usize) -> usize {
        self.runs.partition_point(|&(start, _)| start <= off) - 1
    }

    /// The bytes `[off, off + len)` as one span, when they are contiguous in memory.
    pub fn direct(&self, off: usize, len: usize) -> Option<Span> {
        if len == 0 {
            return Some(Span::EMPTY);
        }
        let (start, run) = self.runs[self.run_at(off)];
        (off + len <= start + run.len()).then(|| run.sub(off - start, len))
    }

    /// Visits the contiguous pieces of `[off, off + len)` with their offset in that range.
    fn each(&self, off: usize, len: usize, mut f: impl FnMut(usize, Span)) {
        if len == 0 {
            return;
        }
        let end = off + len;
        let mut i = self.run_at(off);
        let mut at = off;
        while at < end {
            let (start, run) = self.runs[i];
            let take = (start + run.len()).min(end) - at;
            f(at - off, run.sub(at - start, take));
            at += take;
            i += 1;
        }
    }

    /// Copies `[off, off + len)` into the start of `dst`.
    pub fn pack(&self, off: usize, len: usize, dst: Span) {
        self.each(off, len, |o, s| dst.sub(o, s.len()).copy_from(&s));
    }

    /// Copies the first `len` bytes of `src` into `[off, off + len)`.
    pub fn unpack(&self, off: usize, len: usize, src: Span) {
        self.each(off, len, |o, s| s.copy_from(&src.sub(o, s.len())));
    }
}

/// Sends `send` to its peer and receives `recv` from its peer concurrently, each framed in
/// pieces of `chunk` bytes. Non-contiguous pieces pass through staging slots
/// `slots..slots + 2 * WINDOW`.
pub fn exchange(
    cx: &mut OpCtx<'_>,
    send: Option<(usize, &Stream)>,
    recv: Option<(usize, &Stream)>,
    chunk: usize,
    slots: usize,
) -> Result<()> {
    let sp: Vec<(usize, usize)> =
        send.map_or(Vec::new(), |(_, s)| chunks(s.len(), chunk).collect());
    let rp: Vec<(usize, usize)> =
        recv.map_or(Vec::new(), |(_, s)| chunks(s.len(), chunk).collect());
    let send_slots: Vec<Span> = (0..WINDOW).map(|i| cx.staging.slot(slots + i)).collect();
    let recv_slots: Vec<Span> = (0..WINDOW)
        .map(|i| cx.staging.slot(slots + WINDOW + i))
        .collect();

    // Receives in flight, in posting order: request and, for packed pieces, the slot to unpack.
    let mut recvs: VecDeque<(ReqId, Option<Span>)> = VecDeque::new();
    let post_recv = |cx: &mut OpCtx<'_>, k: usize| -> Result<(ReqId, Option<Span>)> {
        let (peer, stream) = recv.expect("pieces exist only with a stream");
        let (off, len) = rp[k];
        Ok(match stream.direct(off, len) {
            Some(dst) => (cx.recv(peer, dst)?, None),
            None => {
                let slot = recv_slots[k % WINDOW].sub(0, len);
                (cx.recv(peer, slot)?, Some(slot))
            }
        })
    };
    for k in 0..rp.len().min(WINDOW) {
        recvs.push_back(post_recv(cx, k)?);
    }
    let mut direct_sends = Vec::new();
    let mut slot_sends: [Option<ReqId>; WINDOW] = [None; WINDOW];
    for k in 0..sp.len().max(rp.len()) {
        if let Some(&(off, len)) = sp.get(k) {
            let (peer, stream) = send.expect("pieces exist only with a stream");
            match stream.direct(off, len) {
                Some(src) => direct_sends.push(cx.send(peer, src)?),
                None => {
                    if let Some(req) = slot_sends[k % WINDOW].take() {
                        cx.wait(req)?;
                    }
                    let slot = send_slots[k % WINDOW].sub(0, len);
                    stream.pack(off, len, slot);
                    slot_sends[k % WINDOW] = Some(cx.send(peer, slot)?);
                }
            }
        }
        if k < rp.len() {
            let (req, packed) = recvs.pop_front().expect("receive posted for every piece");
            cx.wait(req)?;
            if let Some(slot) = packed {
                let (_, stream) = recv.expect("pieces exist only with a stream");
                stream.unpack(rp[k].0, rp[k].1, slot);
            }
            if k + WINDOW < rp.len() {
                recvs.push_back(post_recv(cx, k + WINDOW)?);
            }
        }
    }
    direct_sends.extend(slot_sends.into_iter().flatten());
    cx.wait_all(&mut direct_sends)
}

/// Posts `data` to `peer` framed in pieces of `chunk` bytes; returns the requests.
pub fn post_send_chunked(
    cx: &mut OpCtx<'_>,
    peer: usize,
    data: Span,
    chunk: usize,
) -> Result<Vec<ReqId>> {
    chunks(data.len(), chunk)
        .map(|(off, len)| cx.send(peer, data.sub(off, len)))
        .collect()
}

/// Posts receives of `data` from `peer` framed in pieces of `chunk` bytes; returns them.
pub fn post_recv_chunked(
    cx: &mut OpCtx<'_>,
    peer: usize,
    data: Span,
    chunk: usize,
) -> Result<Vec<ReqId>> {
    chunks(data.len(), chunk)
        .map(|(off, len)| cx.recv(peer, data.sub(off, len)))
        .collect()
}

/// Sends `send` and receives `recv` (directly into place), both framed in `chunk` pieces.
pub fn exchange_chunked(
    cx: &mut OpCtx<'_>,
    send: Option<(usize, Span)>,
    recv: Option<(usize, Span)>,
    chunk: usize,
) -> Result<()> {
    let mut reqs = match recv {
        Some((peer, data)) => post_recv_chunked(cx, peer, data, chunk)?,
        None => Vec::new(),
    };
    if let Some((peer, data)) = send {
        reqs.extend(post_send_chunked(cx, peer, data, chunk)?);
    }
    cx.wait_all(&mut reqs)
}

/// How a received partial joins the local data in [`exchange_reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// `dst ⊕= received`: both are partials (already prescaled).
    Partial,
    /// `dst ⊕= prescale(received)`: the peer sent its raw input.
    RawInput,
}

/// Sends `send` to `to` in `chunk` pieces while receiving `dst.len()` bytes from `from` in
/// `chunk` pieces through staging slots `slots` and `slots + 1`, combining each piece into
/// `dst` as it lands (double-buffered: the next piece is in flight during the reduction).
#[allow(clippy::too_many_arguments)]
pub fn exchange_reduce(
    cx: &mut OpCtx<'_>,
    red: &Reducer,
    to: Option<(usize, Span)>,
    from: usize,
    dst: Span,
    join: Join,
    chunk: usize,
    slots: usize,
) -> Result<()> {
    let bufs = [cx.staging.slot(slots), cx.staging.slot(slots + 1)];
    let pieces: Vec<(usize, usize)> = chunks(dst.len(), chunk).collect();
    let mut inflight = VecDeque::new();
    for (k, &(_, len)) in pieces.iter().enumerate().take(2) {
        inflight.push_back(cx.recv(from, bufs[k].sub(0, len))?);
    }
    let mut sends = match to {
        Some((peer, data)) => post_send_chunked(cx, peer, data, chunk)?,
        None => Vec::new(),
    };
    for (k, &(off, len)) in pieces.iter().enumerate() {
        let req = inflight
            .pop_front()
            .expect("a receive is posted for every piece");
        cx.wait(req)?;
        let (d, s) = (dst.sub(off, len), bufs[k % 2].sub(0, len));
        match join {
            Join::Partial => ctx::combine(red, d, s),
            Join::RawInput => ctx::combine_input(red, d, s),
        }
        if let Some(&(_, next_len)) = pieces.get(k + 2) {
            inflight.push_back(cx.recv(from, bufs[k % 2].sub(0, next_len))?);
        }
    }
    cx.wait_all(&mut sends)
}

/// The direct (one-shot) reduction shared by all_reduce, reduce and reduce_scatter: this rank
/// sends each `(peer, data)` of `sends` to its peer, and, when `mine` is given, receives from
/// every other rank its contribution to this rank's result and reduces them **in rank order
/// 0..n-1** (so every rank computing the same result gets bitwise the same bytes), `mine` being
/// this rank's own contribution, and writes the result into `dst` (which may alias `mine` or a
/// sent span: a piece is written only after it was read and sent).
///
/// Pieces are `piece` bytes (see [`direct_piece`]); received pieces of one round share staging
/// slots from `slots` on, double-buffered across rounds. A rank that reduces sends its pieces at
/// most [`SENDS_AHEAD`] ahead of the one it reduces, as its peers receive them. The
/// contributions are folded in one pass per [`FOLD_WIDTH`](crate::kernels::FOLD_WIDTH) (ops that prescale inputs combine them
/// one by one), straight into `dst` where it shares no byte with `mine` or a sent span, else
/// into an accumulator (one more slot), copied to `dst` once sent.
pub fn direct_reduce(
    cx: &mut OpCtx<'_>,
    red: &Reducer,
    sends: &[(usize, Span)],
    mine: Option<(Span, Span)>,
    piece: usize,
    slots: usize,
) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let slot_bytes = cx.staging.chunk_for(1);
    let per_slot = (slot_bytes / piece).max(1);
    let slots_per_round = (n.saturating_sub(1)).div_ceil(per_slot).max(1);
    // Where peer `j`'s piece lands in buffer set `b` (0 or 1).
    let area: Vec<Vec<Span>> = (0..2)
        .map(|b| {
            (0..n)
                .map(|j| {
                    let idx = if j < r { j } else { j.saturating_sub(1) };
                    let slot = cx
                        .staging
                        .slot(slots + b * slots_per_round + idx / per_slot);
                    slot.sub((idx % per_slot) * piece, piece)
                })
                .collect()
        })
        .collect();

    // Sends of piece k to every destination, so a piece of `dst` is only written once sent.
    let send_pieces = sends
        .iter()
        .map(|(_, d)| d.len().div_ceil(piece))
        .max()
        .unwrap_or(0);
    let mut sends_by_piece: Vec<Vec<ReqId>> = Vec::with_capacity(send_pieces);
    let post_sends =
        |cx: &mut OpCtx<'_>, upto: usize, posted: &mut Vec<Vec<ReqId>>| -> Result<()> {
            while posted.len() < upto.min(send_pieces) {
                let k = posted.len();
                let reqs = sends
                    .iter()
                    .filter_map(|&(peer, d)| {
                        let (off, len) = chunks(d.len(), piece).nth(k)?;
                        Some(cx.send(peer, d.sub(off, len)))
                    })
                    .collect::<Result<Vec<ReqId>>>()?;
                posted.push(reqs);
            }
            Ok(())
        };
    let first = if mine.is_some() {
        SENDS_AHEAD
    } else {
        send_pieces
    };
    post_sends(cx, first, &mut sends_by_piece)?;
    if let Some((mine, dst)) = mine {
        let straight = !dst.overlaps(&mine) && sends.iter().all(|(_, s)| !dst.overlaps(s));
        // The accumulator's slot is allocated only where it is used.
        let acc = (!straight).then(|| cx.staging.slot(slots + 2 * slots_per_round));
        let pieces: Vec<(usize, usize)> = chunks(mine.len(), piece).collect();
        let mut posted: VecDeque<Vec<ReqId>> = VecDeque::new();
        let post = |cx: &mut OpCtx<'_>, k: usize| -> Result<Vec<ReqId>> {
            let len = pieces[k].1;
            (0..n)
                .filter(|&j| j != r)
                .map(|j| cx.recv(j, area[k % 2][j].sub(0, len)))
                .collect()
        };
        for k in 0..pieces.len().min(2) {
            posted.push_back(post(cx, k)?);
        }
        for (k, &(off, len)) in pieces.iter().enumerate() {
            let mut reqs = posted.pop_front().expect("posted two rounds ahead");
            cx.wait_all(&mut reqs)?;
            let a = match acc {
                Some(acc) => acc.sub(0, len),
                None => dst.sub(off, len),
            };
            let own = mine.sub(off, len);
            let srcs: Vec<Span> = (0..n)
                .map(|j| {
                    if j == r {
                        own
                    } else {
                        area[k % 2][j].sub(0, len)
                    }
                })
                .collect();
            if red.needs_prescale() {
                ctx::load_input(red, a, srcs[0]);
                for &src in &srcs[1..] {
                    ctx::combine_input(red, a, src);
                }
            } else {
                ctx::fold(red, a, &srcs);
            }
            ctx::finish(red, a);
            if acc.is_some() {
                if let Some(reqs) = sends_by_piece.get_mut(k) {
                    cx.wait_all(reqs)?;
                }
                dst.sub(off, len).copy_from(&a);
            }
            if k + 2 < pieces.len() {
                posted.push_back(post(cx, k + 2)?);
            }
            post_sends(cx, k + 1 + SENDS_AHEAD, &mut sends_by_piece)?;
        }
    }
    post_sends(cx, send_pieces, &mut sends_by_piece)?;
    for reqs in &mut sends_by_piece {
        cx.wait_all(reqs)?;
    }
    Ok(())
}

/// Pieces a rank of [`direct_reduce`] that also reduces sends ahead of the one it reduces. Sends
/// posted all at once run ahead into the peers' socket buffers and take the cores from the
/// reductions (2 ranks of 2 cores over TCP: direct reduce_scatter at 64 MiB took 0.76 of the
/// ring's time with all posted at once, 0.66 paced; direct all_reduce 1.17 and 0.90).
const SENDS_AHEAD: usize = 2;

/// Piece size of [`direct_reduce`] for `n` ranks: one round's pieces from all peers fit one
/// staging chunk (at least one element each).
pub fn direct_piece(cx: &OpCtx<'_>, n: usize, elem: usize) -> usize {
    let chunk = cx.staging.chunk_for(elem);
    ((chunk / n.saturating_sub(1).max(1)) / elem).max(1) * elem
}

/// Largest power of two not above `n` (n >= 1).
pub fn pow2_floor(n: usize) -> usize {
    1 << (usize::BITS - 1 - n.leading_zeros())
}

/// The standard fix-up that runs a power-of-two algorithm on any rank count: with `p` the
/// largest power of two not above `n` and `rem = n - p`, each even rank below `2 rem` folds into
/// the odd rank above it and sits out; the other `p` ranks get new ranks `0..p`, and new rank
/// `g` stands for the contiguous real ranks `first(g)..first(g + 1)` (two for folded pairs).
#[derive(Debug, Clone, Copy)]
pub struct Fold {
    /// Power of two taking part.
    pub p: usize,
    /// Ranks folded away.
    pub rem: usize,
}

/// This rank's part in a [`Fold`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Sits out; its partner (the next rank) acts for it.
    Extra {
        /// The partner.
        partner: usize,
    },
    /// Takes part as new rank `new`; `extra` is the folded rank it acts for, if any.
    Active {
        /// New rank in `0..p`.
        new: usize,
        /// The folded partner.
        extra: Option<usize>,
    },
}

impl Fold {
    /// The fold for `n` ranks.
    pub fn new(n: usize) -> Fold {
        let p = pow2_floor(n.max(1));
        Fold { p, rem: n - p }
    }

    /// The role of real rank `r`.
    pub fn role(&self, r: usize) -> Role {
        if r < 2 * self.rem {
            if r % 2 == 0 {
                Role::Extra { partner: r + 1 }
            } else {
                Role::Active {
                    new: r / 2,
                    extra: Some(r - 1),
                }
            }
        } else {
            Role::Active {
                new: r - self.rem,
                extra: None,
            }
        }
    }

    /// The real rank acting as new rank `g`.
    pub fn real(&self, g: usize) -> usize {
        if g < self.rem {
            2 * g + 1
        } else {
            g + self.rem
        }
    }

    /// The first real rank new rank `g` stands for (`g == p` gives `n`).
    pub fn first(&self, g: usize) -> usize {
        if g < self.rem {
            2 * g
        } else {
            g + self.rem
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_merges_adjacent_blocks_and_packs_across_gaps() {
        let mut a = vec![0u8; 16];
        let mut b = vec![0u8; 4];
        // SAFETY: the vectors outlive the spans and are only touched through them.
        let (sa, sb) = unsafe { (Span::from_slice(&mut a), Span::from_slice(&mut b)) };
        let s = Stream::new([sa.sub(0, 4), sa.sub(4, 4), sb, sa.sub(12, 4)]);
        assert_eq!(s.len(), 16);
        assert_eq!(s.direct(0, 8), Some(sa.sub(0, 8)));
        assert_eq!(s.direct(6, 4), None);
        assert_eq!(s.direct(8, 4), Some(sb));
        let src: Vec<u8> = (0..16).collect();
        let mut tmp = src.clone();
        // SAFETY: as above.
        let st = unsafe { Span::from_slice(&mut tmp) };
        s.unpack(2, 12, st.sub(2, 12));
        let mut back = vec![0u8; 12];
        // SAFETY: as above.
        let sback = unsafe { Span::from_slice(&mut back) };
        s.pack(2, 12, sback);
        assert_eq!(back, src[2..14]);
        assert_eq!(&a[2..8], &src[2..8]);
        assert_eq!(b, src[8..12]);
        assert_eq!(&a[12..14], &src[12..14]);
    }

    #[test]
    fn fold_covers_every_rank_once() {
        for n in 1..=40 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && 2 * f.p > n);
            let mut seen = vec![0; n];
            for g in 0..f.p {
                assert!(f.first(g) < f.first(g + 1));
                for count in &mut seen[f.first(g)..f.first(g + 1)] {
                    *count += 1;
                }
                assert_eq!(
                    f.role(f.real(g)),
                    Role::Active {
                        new: g,
                        extra: (g < f.rem).then(|| f.real(g) - 1)
                    }
                );
            }
            assert_eq!(f.first(f.p), n);
            assert!(seen.iter().all(|&c| c == 1), "n={n}");
        }
    }
}
