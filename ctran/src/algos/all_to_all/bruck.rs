//! Bruck all_to_all for small equal blocks: after a local rotation, in round `k` each rank sends
//! every block whose index has bit `k` set to rank `r + 2^k` (packed into one message) and
//! receives as many from rank `r - 2^k`; after `ceil(log2 n)` rounds every block has reached its
//! destination. `log2 n` messages per rank instead of `n-1`, at the price of moving each block
//! up to `log2 n` times.
//!
//! Needs equal blocks (a rank forwards blocks of others, whose sizes it must know) and a staging
//! chunk that holds all `n` blocks (`n x block <= chunk_bytes`): the rotated blocks live in one
//! slot, the packed sends and receives in two more.

use crate::algos::ctx::OpCtx;
use crate::error::{Error, Result};
use crate::span::Span;

/// True when Bruck can run this all_to_all: every block (sent and received) has the same size
/// and all `n` of them fit one staging chunk of `chunk_bytes`.
pub fn applicable(inputs: &[Span], outputs: &[Span], chunk_bytes: usize) -> bool {
    let b = inputs.first().map_or(0, Span::len);
    inputs.iter().chain(outputs).all(|s| s.len() == b) && inputs.len() * b <= chunk_bytes
}

/// Runs the Bruck all_to_all.
pub fn run(cx: &mut OpCtx<'_>, inputs: &[Span], outputs: &[Span]) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    if !applicable(inputs, outputs, cx.staging.chunk_for(1)) {
        return Err(Error::invalid(
            "algo",
            "equal blocks that fit one staging chunk together for bruck",
            "bruck",
        ));
    }
    let b = inputs[0].len();
    let (rot, sbuf, rbuf) = (cx.staging.slot(0), cx.staging.slot(1), cx.staging.slot(2));
    // Block `j` of `rot` travels from this rank to rank `r + j`.
    let at = |j: usize| rot.sub(j * b, b);
    for j in 0..n {
        at(j).copy_from(&inputs[(r + j) % n]);
    }
    let mut k = 1;
    while k < n {
        let moving: Vec<usize> = (0..n).filter(|j| j & k != 0).collect();
        for (i, &j) in moving.iter().enumerate() {
            sbuf.sub(i * b, b).copy_from(&at(j));
        }
        let len = moving.len() * b;
        cx.sendrecv(
            (r + k) % n,
            sbuf.sub(0, len),
            (r + n - k) % n,
            rbuf.sub(0, len),
        )?;
        for (i, &j) in moving.iter().enumerate() {
            at(j).copy_from(&rbuf.sub(i * b, b));
        }
        k *= 2;
    }
    // Block `j` now holds what rank `r - j` sent here.
    for j in 0..n {
        outputs[(r + n - j) % n].copy_from(&at(j));
    }
    Ok(())
}
