//! What each algorithm does, counted for the model: hops, messages, bytes per rank, bytes on
//! the critical path, bytes reduced and copied.

use crate::algos::all_reduce::halving_doubling;
use crate::algos::pipe::pow2_floor;
use crate::algos::reduce_scatter::recursive_halving;
use crate::algos::select::{Algo, Shape};
use crate::algos::tree;
use crate::kernels::FOLD_WIDTH;

/// What an algorithm does, counted for the model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Profile {
    /// Hops on the critical path: message latencies that follow one another.
    pub hops: f64,
    /// Messages sent by all ranks. The pieces of one transfer (what a rank sends one peer in
    /// one step) that are posted at once count as one: they share the system calls and the
    /// receiver's wake-up. The pieces of a pipeline count one each: each waits for the stage
    /// before it.
    pub messages: f64,
    /// The bytes that the ranks most likely to be the busiest send and receive: the one that
    /// sends most and the one that receives most (the same where all ranks do alike), in time
    /// order: transfers that overlap count once.
    pub loads: [Load; 2],
    /// Bytes sent by all ranks.
    pub total: f64,
    /// Bytes moved one transfer after another along the critical path: a pipeline's hops times
    /// its piece. Where a pipeline has few pieces (one below a chunk), its stages run in turn, and
    /// a chain of `n` ranks moves the buffer `n - 1` times over, not once.
    pub path: f64,
    /// Bytes reduced on the critical path.
    pub reduced: f64,
    /// Bytes copied through staging on the critical path.
    pub copied: f64,
    /// A pipeline: pieces pass from rank to rank one stage after another (ring, chain, tree,
    /// recursive halving's rounds); see [`RING_STALL`](super::RING_STALL).
    pub chained: bool,
    /// Every rank copies its bytes through staging at the same moment (Bruck's rotations and
    /// packing): on a host with more ranks than cores the copies share its cores, `kappa` times
    /// slower than gamma, the best of three short sums timed on each rank (the speed of a core
    /// that one rank has to itself).
    pub copies_at_once: bool,
}

/// Bytes one rank sends and receives in a collective.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    /// Bytes the rank sends.
    pub sent: f64,
    /// Bytes the rank receives.
    pub received: f64,
}

impl Load {
    /// A rank that sends and receives `x` bytes.
    pub fn even(x: f64) -> Load {
        Load {
            sent: x,
            received: x,
        }
    }

    /// A rank that sends `sent` bytes and receives `received`.
    pub fn of(sent: f64, received: f64) -> Load {
        Load { sent, received }
    }
}

impl Profile {
    /// Every rank sends and receives `x` bytes.
    fn even(&mut self, x: f64) {
        self.loads = [Load::even(x); 2];
    }

    /// Reduction of a direct all_reduce or reduce of `s` bytes over `nf` ranks, in place,
    /// counted as before the fold (a load, `nf - 1` combines, a copy out): measured on 2 ranks
    /// after it, both stayed 1.3-1.6x behind the ring and the tree at 1-64 MiB (everything they
    /// receive passes through staging), which the gamma of an in-cache combine under-weighs
    /// already.
    fn reduce_in_place(&mut self, nf: f64, s: f64) {
        self.reduced = (nf - 1.0) * s;
        self.copied = 2.0 * s;
    }
}

/// Pairwise combines' worth of memory traffic in a fold of `k` contributions
/// ([`Reducer::fold`](crate::kernels::Reducer::fold)), per byte of the result: one pass per
/// [`FOLD_WIDTH`] sources, each reading its sources (and the result, after the first) and writing
/// the result once, where a combine reads two buffers and writes one. Measured 1.6 combines for
/// 4 sources and 3.6 for 8 (`cargo bench -p ctran --bench reduce -- fold`).
fn fold_cost(k: usize) -> f64 {
    let passes = k.div_ceil(FOLD_WIDTH).max(1);
    (k + 2 * passes - 1) as f64 / 3.0
}

pub(super) fn log2_ceil(n: usize) -> f64 {
    f64::from(usize::BITS - (n.max(1) - 1).leading_zeros())
}

/// Profile of `algo` for a call of `shape` on `n` ranks with staging chunks of `chunk` bytes.
pub fn profile(algo: Algo, shape: &Shape, n: usize, chunk: usize) -> Profile {
    if n <= 1 {
        return Profile::default();
    }
    let f = counts(algo, shape, n, chunk);
    // Gather mirrors scatter: what a rank sends there, it receives here.
    if matches!(algo, Algo::GatherDirect | Algo::GatherTree) {
        let flip = |l: Load| Load::of(l.received, l.sent);
        return Profile {
            loads: f.loads.map(flip),
            ..f
        };
    }
    f
}

/// [`profile`] for `n >= 2`, gather counted as scatter.
fn counts(algo: Algo, shape: &Shape, n: usize, chunk: usize) -> Profile {
    use Algo::*;
    let s = shape.bytes as f64;
    let nf = n as f64;
    let l = log2_ceil(n);
    let p = pow2_floor(n);
    let (pf, lp, rem) = (p as f64, log2_ceil(p), (n - p) as f64);
    let folded = if rem > 0.0 { 1.0 } else { 0.0 };
    let c = chunk.max(1) as f64;
    // Pieces of `x` bytes in chunks of `c` (none for nothing).
    let pcs = |x: f64, c: f64| if x <= 0.0 { 0.0 } else { (x / c).ceil() };
    // One of `k` pieces of `x` bytes.
    let piece = |x: f64, k: f64| if k > 0.0 { x / k } else { 0.0 };
    // Direct reductions cut pieces so that one from every peer fits a chunk.
    let direct_piece = (c / (nf - 1.0)).floor().max(shape.elem as f64);
    let b = s / nf;
    let mut f = Profile::default();
    match algo {
        AllReduceRing => {
            f.chained = true;
            let k = pcs(b, c);
            f.hops = 2.0 * (nf - 1.0) + (k - 1.0).max(0.0);
            f.path = f.hops * piece(b, k);
            f.messages = nf * 2.0 * (nf - 1.0) * k;
            f.even(2.0 * (nf - 1.0) * b);
            f.total = nf * 2.0 * (nf - 1.0) * b;
            f.reduced = (nf - 1.0) * b;
        }
        AllReduceHalvingDoubling => {
            f.hops = 2.0 * lp + 2.0 * folded + (pcs(s / 2.0, c) - 1.0).max(0.0);
            let count = shape.bytes / shape.elem.max(1);
            f.messages = 2.0 * halving_doubling::halving_transfers(count, p) as f64 + rem * 2.0;
            f.even(2.0 * (pf - 1.0) / pf * s + folded * s);
            f.total = 2.0 * (pf - 1.0) * s + rem * 2.0 * s;
            f.reduced = (pf - 1.0) / pf * s + folded * s;
        }
        AllReduceDirect => {
            let k = pcs(s, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf * (nf - 1.0);
            f.even((nf - 1.0) * s);
            f.total = nf * (nf - 1.0) * s;
            f.reduce_in_place(nf, s);
        }
        AllReduceTree => {
            f.chained = true;
            let k = pcs(s, c);
            // A chunk's result goes back down as soon as the root has it.
            f.hops = 2.0 * l + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = 2.0 * (nf - 1.0) * k;
            f.even(l * s);
            f.total = 2.0 * (nf - 1.0) * s;
            f.reduced = l * s;
        }
        AllGatherRing => {
            f.chained = true;
            let k = pcs(b, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(b, k);
            f.messages = nf * (nf - 1.0) * k;
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
        }
        AllGatherRecursiveDoubling => {
            f.hops = lp + 2.0 * folded;
            f.messages = pf * lp + rem * 2.0;
            f.even((pf - 1.0) / pf * s + folded * s / 2.0);
            f.total = (pf - 1.0) * s + rem * s;
        }
        AllGatherBruck => {
            // One transfer per rank in each of its ceil(log2 n) steps.
            f.messages = nf * l;
            f.hops += l;
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
        }
        AllGatherDirect | AllToAllDirect => {
            f.hops = 1.0;
            f.messages = nf * (nf - 1.0);
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
        }
        ReduceScatterRing => {
            f.chained = true;
            let k = pcs(b, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(b, k);
            f.messages = nf * (nf - 1.0) * k;
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
            f.reduced = (nf - 1.0) * b;
        }
        ReduceScatterRecursiveHalving => {
            // Rounds of `chunk / n` bytes one after another, each step of a round waiting for
            // the partner's half: stages of a pipeline.
            f.chained = true;
            let round = recursive_halving::round_bytes(chunk, n, shape.elem).max(1) as f64;
            let rounds = (shape.max_block as f64 / round).ceil().max(1.0);
            f.hops = rounds * (lp + 2.0 * folded);
            f.messages = rounds * (pf * lp + 2.0 * rem);
            f.even((pf - 1.0) / pf * s + folded * s);
            f.total = (pf - 1.0) * s + rem * (s + b);
            f.reduced = (pf - 1.0) / pf * s + folded * s;
            f.copied = s;
        }
        ReduceScatterDirect => {
            let k = pcs(b, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf * (nf - 1.0);
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
            // Folded straight into the output, a tensor apart from the input.
            f.reduced = fold_cost(n) * b;
        }
        BroadcastTree => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = l + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            // The root sends to each of its l children; its first child receives and sends to
            // its own l - 1.
            f.loads = [Load::of(l * s, 0.0), Load::of((l - 1.0) * s, s)];
            f.total = (nf - 1.0) * s;
        }
        BroadcastChain => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            let middle = if n > 2 { s } else { 0.0 };
            f.loads = [Load::of(s, 0.0), Load::of(middle, s)];
            f.total = (nf - 1.0) * s;
        }
        BroadcastDirect => {
            f.hops = 1.0;
            f.messages = nf - 1.0;
            f.loads = [Load::of((nf - 1.0) * s, 0.0), Load::of(0.0, s)];
            f.total = (nf - 1.0) * s;
        }
        ReduceTree => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = l + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            // The broadcast tree's loads, turned around.
            f.loads = [Load::of(0.0, l * s), Load::of(s, (l - 1.0) * s)];
            f.total = (nf - 1.0) * s;
            f.reduced = l * s;
        }
        ReduceDirect => {
            let k = pcs(s, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf - 1.0;
            f.loads = [Load::of(0.0, (nf - 1.0) * s), Load::of(s, 0.0)];
            f.total = (nf - 1.0) * s;
            f.reduce_in_place(nf, s);
        }
        AllToAllPairwise => {
            f.hops += nf - 1.0;
            f.messages = nf * (nf - 1.0);
            f.even((nf - 1.0) * b);
            f.total = nf * (nf - 1.0) * b;
        }
        AllToAllBruck => {
            f.hops += l;
            f.messages = nf * l;
            f.even(l * s / 2.0);
            f.total = nf * l * s / 2.0;
            f.copied = (l + 2.0) * s;
            f.copies_at_once = true;
        }
        ScatterDirect | GatherDirect => {
            f.hops = 1.0;
            f.messages = nf - 1.0;
            f.loads = [Load::of((nf - 1.0) * b, 0.0), Load::of(0.0, b)];
            f.total = (nf - 1.0) * b;
        }
        ScatterTree | GatherTree => {
            f.hops = l;
            f.messages = nf - 1.0;
            // The root sends all blocks but its own; its first child receives its subtree's
            // blocks and passes on all but its own.
            let first = tree::subtree(pow2_floor(n - 1), n) as f64;
            f.loads = [
                Load::of((nf - 1.0) * b, 0.0),
                Load::of((first - 1.0) * b, first * b),
            ];
            f.total = l * s / 2.0;
            // The root stages every block but its own and its leaf child's.
            f.copied = s - 2.0 * b;
        }
        BarrierDissemination => {
            f.hops += l;
            f.messages = nf * l;
        }
    }
    f
}
