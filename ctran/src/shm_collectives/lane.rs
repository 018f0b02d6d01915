//! One lane of the shared-memory collectives: the state a thread needs to run its part of an
//! operation (its view of the segment, its barrier and round counters, its read buffer), and
//! how an operation is cut into one part per lane.
//!
//! Every rank cuts an operation the same way from sizes that all ranks agree on (each lane's
//! part is checked by that lane's first barrier like a whole operation), so lane `l` of every
//! rank runs the same part, and the lanes need nothing from each other until the operation ends.

use crate::comm::Op;
use crate::gpe::plan::map_spans;
use crate::span::Span;
use crate::transport::shm::node::Node;

/// What one lane of a rank keeps between operations.
#[derive(Debug)]
pub struct Lane {
    /// The segment, seen on this lane.
    pub(crate) node: Node,
    /// Collective buffers used so far (their parity picks the buffer).
    pub(crate) coll_rounds: u64,
    /// Barriers passed.
    pub(crate) arrivals: u64,
    /// Which of the two descriptors the current collective published.
    pub(crate) published: usize,
    /// Every local rank can read every other's memory (cross-memory attach), agreed at init.
    pub(crate) cma: bool,
    /// Smallest operation (the whole of it, whatever the lanes) sent by cross-memory attach.
    pub(crate) cma_min_bytes: usize,
    /// Where peers' data is read before it is reduced (cross-memory attach only).
    pub(crate) cma_buf: Vec<u8>,
    /// all_to_all copies through the shared buffers instead of reading peers' memory (see
    /// [`Lane::new`]).
    pub(crate) all_to_all_copies: bool,
}

impl Lane {
    /// A lane over `node` (already the lane's view) of a rank whose host runs `lanes` lanes,
    /// with a read buffer of `cma_chunk_bytes` when cross-memory attach is on.
    ///
    /// all_to_all reads peers' memory (one copy) where that is available, unless more than two
    /// ranks share a host with cores to spare (lanes): there every rank reads every other's
    /// pages at once, and `process_vm_readv` (which pins each page it copies) moved under 2
    /// GB/s per thread against 8-10 for a plain copy, so two plain copies through the shared
    /// buffers took 0.4-0.8 of the time (8 ranks on 16 cores: 4 MiB in 480-760 us against
    /// 864-1282 over two runs; 4 ranks: 16 MiB in 930 us against 1250). On a 2-core host the
    /// one copy stays faster (2 and 4 ranks: copies took up to 2.3 times as long from 256 KiB).
    pub(crate) fn new(
        node: Node,
        lanes: usize,
        cma: bool,
        cma_min_bytes: usize,
        cma_chunk_bytes: usize,
    ) -> Lane {
        let all_to_all_copies = !cma || (node.nlocal() > 2 && lanes > 1);
        Lane {
            node,
            coll_rounds: 0,
            arrivals: 0,
            published: 0,
            cma,
            cma_min_bytes,
            cma_buf: if cma {
                vec![0u8; cma_chunk_bytes.max(4096)]
            } else {
                Vec::new()
            },
            all_to_all_copies,
        }
    }
}

/// Bytes of `op` that decide whether it is cut into lanes: a size every rank agrees on (the
/// first barrier checks it), so every rank decides alike. `None`: an all_to_all, whose totals
/// may differ per rank (its ranks agree on their sum first, see `Team::cuts_all_to_all`).
pub(super) fn agreed_bytes(op: &Op) -> Option<usize> {
    match op {
        Op::AllReduce { buf, .. } | Op::Reduce { buf, .. } | Op::Broadcast { buf, .. } => {
            Some(buf.len())
        }
        Op::AllGather { outputs, .. } => Some(outputs.iter().map(Span::len).sum()),
        Op::ReduceScatter { inputs, .. } => Some(inputs.iter().map(Span::len).sum()),
        _ => None,
    }
}

/// The part of `op` that lane `lane` of `lanes` runs: the same share of every buffer. Shares
/// are whole multiples of `unit` bytes (a multiple of the element size) except the last lane's,
/// which takes the remainder.
pub(super) fn part_of(op: &Op, lane: usize, lanes: usize, unit: usize) -> Op {
    let cut = |s: &Span| {
        let units = s.len() / unit;
        let start = units * lane / lanes * unit;
        let end = if lane + 1 == lanes {
            s.len()
        } else {
            units * (lane + 1) / lanes * unit
        };
        s.sub(start, end - start)
    };
    map_spans(op, 0, &mut |s, _role| cut(&s))
}

/// The unit lanes cut `op`'s buffers in: a cache line's worth of elements.
pub(super) fn unit_of(op: &Op) -> usize {
    let es = match op {
        Op::AllReduce { dtype, .. }
        | Op::Reduce { dtype, .. }
        | Op::ReduceScatter { dtype, .. } => dtype.size_bytes(),
        _ => 1,
    };
    64 * es
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, ReduceOp};

    fn spans(op: &Op) -> Vec<Span> {
        match op {
            Op::AllReduce { buf, .. } => vec![*buf],
            Op::AllGather { input, outputs } => [vec![*input], outputs.clone()].concat(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn lanes_cover_every_byte_once_in_whole_elements() {
        let mut mem = vec![0u8; 1 << 20];
        // SAFETY: `mem` outlives the spans, which are only cut, never read or written.
        let whole = unsafe { Span::from_slice(&mut mem) };
        for len in [0, 4, 256, 260, 4096 + 12, 1 << 20] {
            for lanes in [1, 2, 3, 8] {
                let op = Op::AllReduce {
                    buf: whole.sub(0, len),
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                };
                let unit = unit_of(&op);
                let mut next = whole.addr();
                for l in 0..lanes {
                    let part = spans(&part_of(&op, l, lanes, unit))[0];
                    if part.is_empty() {
                        continue;
                    }
                    assert_eq!(part.addr(), next, "len {len} lanes {lanes} lane {l}");
                    assert_eq!((part.addr() - whole.addr()) % 4, 0);
                    next = part.addr() + part.len();
                }
                if len > 0 {
                    assert_eq!(next, whole.addr() + len);
                }
            }
        }
    }

    #[test]
    fn every_buffer_of_an_all_gather_is_cut_alike() {
        let mut mem = vec![0u8; 3000];
        // SAFETY: as above.
        let m = unsafe { Span::from_slice(&mut mem) };
        let op = Op::AllGather {
            input: m.sub(0, 1000),
            outputs: vec![m.sub(1000, 1000), m.sub(2000, 1000)],
        };
        // 15 whole units of 64 bytes: lane 0 takes 7, lane 1 the other 8 and the 40-byte tail.
        let a = spans(&part_of(&op, 1, 2, unit_of(&op)));
        assert_eq!(a.iter().map(Span::len).collect::<Vec<_>>(), [552, 552, 552]);
        assert_eq!(agreed_bytes(&op), Some(2000));
    }
}
