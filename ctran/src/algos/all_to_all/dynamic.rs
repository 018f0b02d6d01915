//! all_to_all_v whose split sizes live in memory read when the operation runs
//! (`device_alltoallv_single`): no rank needs its peers' counts beforehand. Each rank sends every
//! peer its row count for it, lands the counts it receives in the output counts, checks them
//! against the output's capacity, then moves the rows as the direct all_to_all does, packed at
//! the exclusive prefix sums of the counts.

use crate::algos::all_to_all::direct;
use crate::algos::ctx::OpCtx;
use crate::error::{Error, Result};
use crate::span::Span;

/// The buffers of one dynamic all_to_all.
#[derive(Debug, Clone, Copy)]
pub struct DynamicAllToAll {
    /// Rows to send, packed by destination rank.
    pub input: Span,
    /// Where received rows land, packed by source rank; its length is the capacity.
    pub output: Span,
    /// `size` little-endian i64 row counts, one per destination (read when the operation runs).
    pub input_counts: Span,
    /// `size` i64 row counts, one per source (written with what each peer sent).
    pub output_counts: Span,
    /// Bytes of one input row.
    pub input_row_bytes: usize,
    /// Bytes of one output row.
    pub output_row_bytes: usize,
}

const COUNT: usize = std::mem::size_of::<i64>();

/// Row counts as stored in a counts span; `arg` names it in errors.
fn read_counts(span: Span, n: usize, arg: &str) -> Result<Vec<u64>> {
    if span.len() != n * COUNT {
        return Err(Error::invalid(
            arg,
            format!("{n} int64 counts ({} bytes)", n * COUNT),
            format!("{} bytes", span.len()),
        ));
    }
    let mut raw = vec![0u8; span.len()];
    span.copy_to_slice(&mut raw);
    raw.chunks_exact(COUNT)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .enumerate()
        .map(|(peer, v)| {
            u64::try_from(v).map_err(|_| {
                Error::invalid(format!("{arg}[{peer}]"), "a row count of at least 0", v)
            })
        })
        .collect()
}

/// Cuts `buf` into blocks of `counts[i] * row_bytes` bytes; fails naming `arg` when they do
/// not fit.
fn blocks(buf: Span, counts: &[u64], row_bytes: usize, arg: &str, what: &str) -> Result<Vec<Span>> {
    let rows: u128 = counts.iter().map(|&c| u128::from(c)).sum();
    // Rows of no bytes always fit.
    let capacity = buf
        .len()
        .checked_div(row_bytes)
        .map_or(u128::MAX, |c| c as u128);
    if rows > capacity {
        return Err(Error::invalid(
            arg,
            format!("at most {capacity} rows in total ({what})"),
            format!("{rows} rows"),
        ));
    }
    let mut at = 0;
    Ok(counts
        .iter()
        .map(|&c| {
            let len = c as usize * row_bytes;
            let block = buf.sub(at, len);
            at += len;
            block
        })
        .collect())
}

/// Runs the dynamic all_to_all: counts first, then the rows.
pub fn run(cx: &mut OpCtx<'_>, a: &DynamicAllToAll) -> Result<()> {
    let (n, r) = (cx.size, cx.rank);
    let send = read_counts(a.input_counts, n, "input_split_sizes")?;
    if a.output_counts.len() != n * COUNT {
        return Err(Error::invalid(
            "output_split_sizes",
            format!("{n} int64 counts ({} bytes)", n * COUNT),
            format!("{} bytes", a.output_counts.len()),
        ));
    }
    let inputs = blocks(
        a.input,
        &send,
        a.input_row_bytes,
        "input_split_sizes",
        "the input's rows",
    )?;
    // Every peer's count for this rank lands in its slot of the output counts.
    let slot = |peer: usize| a.output_counts.sub(peer * COUNT, COUNT);
    slot(r).copy_from(&a.input_counts.sub(r * COUNT, COUNT));
    let mut reqs = Vec::with_capacity(2 * n);
    for k in 1..n {
        let from = (r + n - k) % n;
        reqs.push(cx.recv(from, slot(from))?);
    }
    for k in 1..n {
        let to = (r + k) % n;
        reqs.push(cx.send(to, a.input_counts.sub(to * COUNT, COUNT))?);
    }
    cx.wait_all(&mut reqs)?;
    // What peers sent is checked before a byte of theirs lands: a count that does not fit the
    // output fails here, on the receiver, and its abort notice fails the senders.
    let recv = read_counts(a.output_counts, n, "output_split_sizes (as received)")?;
    let outputs = blocks(
        a.output,
        &recv,
        a.output_row_bytes,
        "output",
        "its capacity, for the rows peers sent",
    )?;
    direct::run(cx, &inputs, &outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(v: &mut [i64]) -> Span {
        // SAFETY: the vector outlives the span's use in each test.
        unsafe { Span::from_raw(v.as_mut_ptr().cast(), v.len() * COUNT) }
    }

    #[test]
    fn counts_are_read_and_checked() {
        let mut good = [3i64, 0, 5];
        assert_eq!(read_counts(counts(&mut good), 3, "c").unwrap(), [3, 0, 5]);
        let mut negative = [1i64, -2];
        let e = read_counts(counts(&mut negative), 2, "input_split_sizes").unwrap_err();
        assert!(e.to_string().contains("input_split_sizes[1]"), "{e}");
        let e = read_counts(counts(&mut good), 2, "input_split_sizes").unwrap_err();
        assert!(e.to_string().contains("2 int64 counts"), "{e}");
    }

    #[test]
    fn blocks_fit_or_fail() {
        let mut mem = vec![0u8; 40];
        // SAFETY: `mem` outlives the spans.
        let buf = unsafe { Span::from_slice(&mut mem) };
        let b = blocks(buf, &[2, 0, 3], 8, "output", "cap").unwrap();
        assert_eq!(b.iter().map(Span::len).collect::<Vec<_>>(), [16, 0, 24]);
        assert_eq!(b[2].addr(), buf.addr() + 16);
        let e = blocks(buf, &[2, 4], 8, "output", "cap").unwrap_err();
        assert!(e.to_string().contains("at most 5 rows"), "{e}");
        assert!(blocks(buf, &[u64::MAX, u64::MAX], 8, "output", "cap").is_err());
    }
}
