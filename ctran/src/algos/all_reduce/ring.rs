//! Ring all_reduce: a reduce-scatter around the ring followed by an all-gather, moving
//! `2 (n-1)/n` of the buffer per rank (bandwidth-optimal). Each segment is reduced by exactly one
//! rank and then copied to the others, so every rank ends with bitwise the same result.
//! Incoming data is received in staging chunks (double-buffered) and reduced while the next chunk
//! is in flight.

use crate::algos::ctx::{self, chunks, partition, OpCtx};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Runs the ring all_reduce in place on `buf`.
pub fn run(cx: &mut OpCtx<'_>, buf: Span, dtype: DataType, op: ReduceOp) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let red = Reducer::new(dtype, op, n)?;
    let es = dtype.size_bytes();
    ctx::prescale(&red, buf);
    if n == 1 {
        ctx::finish(&red, buf);
        return Ok(());
    }
    let segs = partition(buf.len() / es, n, es);
    let seg = |i: usize| buf.sub(segs[i].0, segs[i].1);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let chunk = cx.staging.chunk_for(es);

    for s in 0..n - 1 {
        let send = seg((r + n - s) % n);
        let recv = seg((r + 2 * n - s - 1) % n);
        exchange_and_reduce(cx, &red, right, send, left, recv, chunk)?;
    }
    ctx::finish(&red, seg((r + 1) % n));
    for s in 0..n - 1 {
        let send = seg((r + 1 + n - s) % n);
        let recv = seg((r + n - s) % n);
        cx.sendrecv(right, send, left, recv)?;
    }
    Ok(())
}

/// Sends `send` to `to` in chunks while receiving `recv` from `from` in chunks through two
/// staging slots, reducing each received chunk into `recv` as it lands.
fn exchange_and_reduce(
    cx: &mut OpCtx<'_>,
    red: &Reducer,
    to: usize,
    send: Span,
    from: usize,
    recv: Span,
    chunk: usize,
) -> Result<()> {
    let slots = [cx.staging.slot(0), cx.staging.slot(1)];
    let pieces: Vec<(usize, usize)> = chunks(recv.len(), chunk).collect();
    let mut inflight = std::collections::VecDeque::new();
    for (k, &(_, len)) in pieces.iter().enumerate().take(2) {
        inflight.push_back(cx.recv(from, slots[k].sub(0, len))?);
    }
    let mut sends = Vec::new();
    for (off, len) in chunks(send.len(), chunk) {
        sends.push(cx.send(to, send.sub(off, len))?);
    }
    for (k, &(off, len)) in pieces.iter().enumerate() {
        let req = inflight
            .pop_front()
            .expect("a receive is posted for every piece");
        cx.wait(req)?;
        ctx::combine(red, recv.sub(off, len), slots[k % 2].sub(0, len));
        if let Some(&(_, next_len)) = pieces.get(k + 2) {
            inflight.push_back(cx.recv(from, slots[k % 2].sub(0, next_len))?);
        }
    }
    cx.wait_all(&mut sends)
}
