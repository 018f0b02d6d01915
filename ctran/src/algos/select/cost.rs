//! The latency-bandwidth cost model that `auto` picks algorithms with.
//!
//! An algorithm's time on `n` ranks is predicted as
//!
//! ```text
//! T = H alpha + (M_host / C) mu + max(max(B_busiest, B_path) / kappa, B_average) beta
//!     + (R + P) gamma
//! ```
//!
//! - `H`: hops on the critical path (message latencies that follow one another);
//! - `M_host`: messages that the ranks of one host send, `C = min(cores, ranks per host)`: every
//!   message costs CPU time (system calls, a wake-up), and ranks of one host share its cores;
//! - `B`: bytes a rank moves, for the busiest rank and on average: the larger of what it sends
//!   and receives, or, between ranks of one host over TCP, `s sent + (1 - s) received` (at
//!   least what it receives) with `s` the sender's [share](CostModel::send_share) of a
//!   transfer's CPU time (a rank that sends and receives `x` moves `x` either way); `B_path`:
//!   bytes moved one transfer after another along a pipeline's critical path (its hops times its
//!   piece), each transfer as long as the larger of its two ends' shares (`s` over TCP on
//!   loopback: sender and receiver work on two cores at once, and the sender's part is the
//!   larger);
//!   beta is measured with every rank moving data at once, which on a host with more ranks than
//!   cores is `kappa = ranks per host / cores` times slower than a rank alone: a rank that works
//!   while others wait goes `kappa` times faster, but never faster than the host's cores allow
//!   for everyone's bytes;
//! - `R`: bytes reduced on the critical path, `P`: bytes copied through staging, `kappa` times
//!   over where every rank copies at once (Bruck's all_to_all);
//! - the bytes term of a pipeline (ring, chain, tree) costs [`RING_STALL`] more on a host with
//!   more ranks than cores.
//!
//! alpha, mu, beta and gamma are measured on the communicator's own transport at creation
//! ([`calibrate`](super::calibrate)) or configured; the per-algorithm counts are below.

use crate::algos::all_reduce::halving_doubling;
use crate::algos::pipe::pow2_floor;
use crate::algos::reduce_scatter::recursive_halving;
use crate::algos::select::{Algo, Shape};
use crate::algos::tree;
use crate::kernels::FOLD_WIDTH;

/// Extra cost per byte of pipelines, algorithms whose pieces pass from rank to rank one stage
/// after another (ring, chain, the trees of all_reduce, broadcast and reduce, the rounds of
/// recursive halving), on a host with more ranks than cores: a stage waits whenever the rank
/// before it is descheduled, where algorithms in which every rank works in every step
/// (halving-doubling, recursive doubling) or all transfers are in flight (direct) keep the cores
/// busy. Fitted on TCP loopback with 2 to 8 ranks on 2 cores (`docs/perf/algorithms.md`): ring
/// against direct reduce_scatter on 4 ranks; tree against halving-doubling all_reduce at
/// 256 KiB-1 MiB on 4 and 8 ranks, where their bytes are equal and the tree measured up to 1.4x
/// slower; recursive halving against direct reduce_scatter at 1-16 MiB on 4 ranks, 1.1-1.4x
/// slower with the same bytes.
pub const RING_STALL: f64 = 0.1;

/// [`CostModel::send_share`] between ranks of one host over TCP: the sender's system call also
/// runs the loopback's receive processing (the kernel's receive path runs in the sending
/// context), so a byte sent costs the sender about twice the CPU time it costs the receiver.
/// Measured on this 2-core machine, one process streaming 2 GiB to another in 256 KiB-1 MiB
/// writes: the sender used 0.28-0.66 s of CPU, the receiver 0.20-0.26 s, a share of 0.58-0.72
/// (docs/perf/algorithms.md, twentieth session).
pub const LOOPBACK_SEND_SHARE: f64 = 2.0 / 3.0;

/// Parameters of the model, agreed by all ranks of a communicator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Seconds per hop: one message latency on the critical path of a collective, waking the
    /// receiver included.
    pub alpha: f64,
    /// Seconds of CPU per message (posting, system calls, waking the receiver).
    pub mu: f64,
    /// Seconds per byte a rank sends and receives while every rank does.
    pub beta: f64,
    /// Seconds per byte one rank reduces.
    pub gamma: f64,
    /// Where the ranks of a host move bytes over TCP on loopback, the sender's share of the CPU
    /// time that a byte costs both ends ([`LOOPBACK_SEND_SHARE`]), and a rank's bytes are
    /// `share * sent + (1 - share) * received`, but never less than what it receives: one that
    /// only sends (a broadcast's root) is slowed by its share of its sends alone, while one that
    /// receives from every peer still waits for all of it (counted at the receiver's share,
    /// direct reduce was picked where it measured 1.1-1.6x slower than the tree). `None`: a
    /// rank's bytes are the larger of what it sends and receives, as over a full-duplex link
    /// (not measured for shared memory).
    pub send_share: Option<f64>,
    /// Most ranks of the communicator on one host.
    pub ranks_per_host: usize,
    /// Fewest cores of a host of the communicator.
    pub cores_per_host: usize,
    /// Measured at creation (`false`: all configured or defaults).
    pub measured: bool,
}

impl Default for CostModel {
    /// Rough TCP-on-loopback values, used before calibration.
    fn default() -> Self {
        CostModel {
            alpha: 10e-6,
            mu: 5e-6,
            beta: 1.0 / 2e9,
            gamma: 1.0 / 4e9,
            send_share: None,
            ranks_per_host: 1,
            cores_per_host: 1,
            measured: false,
        }
    }
}

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
    /// recursive halving's rounds); see [`RING_STALL`].
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

fn log2_ceil(n: usize) -> f64 {
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

impl CostModel {
    /// Ranks of this communicator on one host (at most `n`).
    fn local(&self, n: usize) -> f64 {
        self.ranks_per_host.clamp(1, n.max(1)) as f64
    }

    /// How much slower a rank moves bytes when all local ranks do than when it works alone.
    fn kappa(&self, n: usize) -> f64 {
        (self.local(n) / self.cores_per_host.max(1) as f64).max(1.0)
    }

    /// Bytes that the busiest rank of a profile moves, weighed as [`send_share`](Self::send_share)
    /// says.
    pub fn busiest(&self, f: &Profile) -> f64 {
        f.loads
            .iter()
            .map(|l| match self.send_share {
                Some(share) => (share * l.sent + (1.0 - share) * l.received).max(l.received),
                None => l.sent.max(l.received),
            })
            .fold(0.0, f64::max)
    }

    /// Predicted seconds of a profile on `n` ranks.
    pub fn time(&self, f: &Profile, n: usize) -> f64 {
        self.terms(f, n).iter().sum()
    }

    /// The terms of [`time`](Self::time), in seconds: hops (alpha), messages (mu), bytes moved
    /// (beta), bytes reduced and copied (gamma).
    pub fn terms(&self, f: &Profile, n: usize) -> [f64; 4] {
        let q = self.local(n);
        let cores = (self.cores_per_host.max(1) as f64).min(q);
        let nf = n.max(1) as f64;
        let messages_host = f.messages * q / nf;
        let stall = if f.chained && self.kappa(n) > 1.0 {
            1.0 + RING_STALL
        } else {
            1.0
        };
        // A stage of a pipeline lasts as long as the busier of its two ends.
        let path = f.path * self.send_share.map_or(1.0, |s| s.max(1.0 - s));
        let bytes = stall * (self.busiest(f).max(path) / self.kappa(n)).max(f.total / nf);
        let copied = if f.copies_at_once {
            f.copied * self.kappa(n)
        } else {
            f.copied
        };
        [
            f.hops * self.alpha,
            messages_host / cores * self.mu,
            bytes * self.beta,
            (f.reduced + copied) * self.gamma,
        ]
    }

    /// Predicted seconds of `algo` for a call of `shape` on `n` ranks with staging chunks of
    /// `chunk` bytes.
    pub fn cost(&self, algo: Algo, shape: &Shape, n: usize, chunk: usize) -> f64 {
        self.time(&profile(algo, shape, n, chunk), n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algos::select::Collective;

    const CHUNK: usize = 1 << 20;

    /// A call of `c` moving `bytes` in all on `n` ranks, in equal blocks where it has blocks.
    fn shape(c: Collective, bytes: usize, n: usize) -> Shape {
        let blocks = matches!(
            c,
            Collective::AllGather
                | Collective::ReduceScatter
                | Collective::AllToAll
                | Collective::Scatter
                | Collective::Gather
        );
        let elem = if matches!(
            c,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        ) {
            4
        } else {
            1
        };
        Shape {
            collective: c,
            bytes,
            max_block: if blocks { bytes / n } else { bytes },
            equal: true,
            elem,
            uniform: true,
        }
    }

    /// Values of the order measured on TCP loopback, `q` ranks on a host of 2 cores.
    fn model(q: usize) -> CostModel {
        CostModel {
            alpha: 15e-6,
            mu: 4e-6,
            beta: 1.0 / 1.5e9,
            gamma: 1.0 / 8e9,
            send_share: None,
            ranks_per_host: q,
            cores_per_host: 2,
            measured: false,
        }
    }

    /// The models that one run of `scripts/bench-algos.sh` measured on this 2-core machine
    /// (eleventh session), for 4 and 8 ranks, alpha halved: it was then a one-way latency of which
    /// a hop cost half. Beta was then the maximum over ranks; the mean, agreed since, is lower
    /// (1.4-2.6 ns/B on 8 ranks), and the picks tested here stay the same with it.
    fn measured(q: usize) -> CostModel {
        let (alpha, mu, beta, gamma) = match q {
            4 => (4.8e-6, 10.9e-6, 1.71e-9, 4.94e-11),
            8 => (14e-6, 10.6e-6, 5.45e-9, 4.96e-11),
            _ => unreachable!("measured for 4 and 8 ranks"),
        };
        CostModel {
            alpha,
            mu,
            beta,
            gamma,
            send_share: Some(LOOPBACK_SEND_SHARE),
            ranks_per_host: q,
            cores_per_host: 2,
            measured: true,
        }
    }

    fn pick(m: &CostModel, c: Collective, bytes: usize, n: usize) -> Algo {
        crate::algos::select::cheapest(m, &shape(c, bytes, n), n, CHUNK)
            .expect("some algorithm applies")
    }

    #[test]
    fn logarithmic_algorithms_count_every_step() {
        for n in [2, 3, 4, 5, 6, 7, 8, 9, 16] {
            let lp = log2_ceil(pow2_floor(n));
            let folded = if pow2_floor(n) < n { 2.0 } else { 0.0 };
            for (algo, c, least) in [
                (
                    Algo::AllReduceHalvingDoubling,
                    Collective::AllReduce,
                    2.0 * lp + folded,
                ),
                (
                    Algo::AllGatherRecursiveDoubling,
                    Collective::AllGather,
                    lp + folded,
                ),
                (
                    Algo::ReduceScatterRecursiveHalving,
                    Collective::ReduceScatter,
                    lp + folded,
                ),
                (Algo::AllGatherBruck, Collective::AllGather, log2_ceil(n)),
                (
                    Algo::AllReduceTree,
                    Collective::AllReduce,
                    2.0 * log2_ceil(n),
                ),
            ] {
                let f = profile(algo, &shape(c, 8 * n, n), n, CHUNK);
                assert!(f.hops >= least, "{algo} on {n} ranks: {} hops", f.hops);
            }
        }
    }

    #[test]
    fn every_algorithm_sends_and_grows_with_size() {
        let m = model(8);
        for n in [2, 3, 5, 8, 16] {
            for c in Collective::ALL {
                for &a in c.algos() {
                    let small = profile(a, &shape(c, 64 * n, n), n, CHUNK);
                    assert!(small.hops >= 1.0, "{a} on {n} ranks: no hop");
                    assert!(
                        small.messages >= (n - 1) as f64,
                        "{a} on {n} ranks: {} messages",
                        small.messages
                    );
                    let mut last = 0.0;
                    for k in 3..27 {
                        let t = m.cost(a, &shape(c, (1 << k) * n, n), n, CHUNK);
                        assert!(t > 0.0 && t >= last, "{a} on {n} ranks: {t} < {last}");
                        last = t;
                    }
                }
            }
        }
        assert_eq!(
            profile(
                Algo::AllReduceRing,
                &shape(Collective::AllReduce, 64, 1),
                1,
                CHUNK
            ),
            Profile::default()
        );
    }

    #[test]
    fn picks_follow_the_regimes() {
        for n in [4, 8] {
            let m = model(n);
            // Large: never the algorithms in which one rank sends the whole buffer to every
            // other (direct all_gather and reduce_scatter move no more than the ring).
            for c in [
                Collective::AllReduce,
                Collective::Broadcast,
                Collective::Reduce,
            ] {
                let a = pick(&m, c, 64 << 20, n);
                assert_ne!(a.name(), "direct", "{c} of 64 MiB on {n} ranks");
            }
            // Small: never the ring, whose 2(n-1) steps are all latency.
            let a = pick(&m, Collective::AllReduce, 8, n);
            assert_ne!(a, Algo::AllReduceRing, "8 B all_reduce on {n} ranks");
            let a = pick(&m, Collective::Broadcast, 8, n);
            assert_ne!(a, Algo::BroadcastChain, "8 B broadcast on {n} ranks");
        }
        // Mid sizes on 4 oversubscribed ranks: halving-doubling, which measured fastest from
        // 256 KiB to 8 MiB (docs/perf/algorithms.md, eleventh session): its halves move no
        // more bytes than the ring's pieces, in fewer steps.
        let a = pick(&model(4), Collective::AllReduce, 2 << 20, 4);
        assert_eq!(
            a,
            Algo::AllReduceHalvingDoubling,
            "2 MiB all_reduce on 4 ranks"
        );
        // Large reduce_scatter: direct, which folds every contribution straight into the
        // output; the ring combines each into a partial it then sends on. Direct measured 3-7%
        // faster than the ring at 256 KiB-16 MiB on 2 ranks with a core each, 10-25% from 2 MiB
        // on 4 ranks sharing 2 cores (docs/perf/algorithms.md, twenty-third session).
        let a = pick(&model(2), Collective::ReduceScatter, 16 << 20, 2);
        assert_eq!(
            a,
            Algo::ReduceScatterDirect,
            "16 MiB reduce_scatter on 2 ranks"
        );
        let a = pick(&measured(4), Collective::ReduceScatter, 16 << 20, 4);
        assert_ne!(
            a,
            Algo::ReduceScatterRing,
            "16 MiB reduce_scatter on 4 ranks"
        );
    }

    #[test]
    fn the_tree_all_reduce_yields_to_halving_doubling_where_it_stops_pipelining() {
        let ar = |bytes| pick(&measured(8), Collective::AllReduce, bytes, 8);
        // Small: the tree's 14 messages against halving-doubling's 48.
        assert_eq!(ar(64 << 10), Algo::AllReduceTree, "64 KiB all_reduce");
        // Below one chunk the tree moves the same bytes as halving-doubling along 6 levels in
        // turn, and measured 1.02-1.43x slower at 512 KiB and 1 MiB.
        for bytes in [512 << 10, 1 << 20] {
            assert_eq!(
                ar(bytes),
                Algo::AllReduceHalvingDoubling,
                "{bytes} B all_reduce"
            );
        }
    }

    #[test]
    fn pieces_posted_at_once_cost_one_message_and_pipelined_ones_each() {
        let rs = shape(Collective::ReduceScatter, 4 << 20, 8);
        // Direct: blocks of 512 KiB in 4 pieces each, all posted at once.
        let direct = profile(Algo::ReduceScatterDirect, &rs, 8, CHUNK);
        assert_eq!((direct.hops, direct.messages), (4.0, 56.0));
        // Halving-doubling and recursive doubling: one transfer per rank and step.
        let ar = shape(Collective::AllReduce, 64 << 20, 8);
        let hd = profile(Algo::AllReduceHalvingDoubling, &ar, 8, CHUNK);
        assert_eq!(hd.messages, 8.0 * 2.0 * 3.0);
        // The ring: each of the 8 pieces of a block of 8 MiB waits for the step before.
        let ring = profile(Algo::AllReduceRing, &ar, 8, CHUNK);
        assert_eq!(ring.messages, 8.0 * 2.0 * 7.0 * 8.0);
        // Direct reduce_scatter measured 1.09-1.19x faster than the ring at 2-4 MiB on 8 ranks
        // of 2 cores in five of six runs (docs/perf/algorithms.md, nineteenth session).
        assert_eq!(
            pick(&measured(8), Collective::ReduceScatter, 4 << 20, 8),
            Algo::ReduceScatterDirect
        );
    }

    #[test]
    fn a_root_that_only_sends_pays_the_senders_share_over_loopback() {
        let loopback = measured(4);
        let duplex = CostModel {
            send_share: None,
            ..loopback
        };
        let bytes: usize = 1 << 20;
        let mb = bytes as f64;
        let bcast = profile(
            Algo::BroadcastDirect,
            &shape(Collective::Broadcast, bytes, 4),
            4,
            CHUNK,
        );
        assert_eq!(duplex.busiest(&bcast), 3.0 * mb);
        assert!((loopback.busiest(&bcast) - 2.0 * mb).abs() < 1.0);
        // A root that receives from every peer keeps its bytes: counted at the receiver's share,
        // direct reduce was picked on 4 ranks at 32-64 MiB, 1.12-1.18x slower than the tree.
        let reduce = profile(
            Algo::ReduceDirect,
            &shape(Collective::Reduce, bytes, 4),
            4,
            CHUNK,
        );
        assert_eq!(loopback.busiest(&reduce), 3.0 * mb);
        // 4 ranks of 2 cores, by the median of eight runs (docs/perf/algorithms.md, twentieth
        // session): at 64 MiB the tree took 0.88 of the chain's time. Counting the tree's root at
        // its full sends picks the chain.
        let pick_of = |m: &CostModel, bytes| pick(m, Collective::Broadcast, bytes, 4);
        assert_eq!(pick_of(&loopback, 64 << 20), Algo::BroadcastTree);
        assert_eq!(pick_of(&duplex, 64 << 20), Algo::BroadcastChain);
    }

    #[test]
    fn a_pipeline_stage_over_loopback_lasts_its_senders_share() {
        let loopback = measured(4);
        let bytes: usize = 1 << 20;
        let tree = profile(
            Algo::BroadcastTree,
            &shape(Collective::Broadcast, bytes, 4),
            4,
            CHUNK,
        );
        // One piece: the root's transfer to its first child, then that child's to its own.
        assert_eq!(tree.path, 2.0 * bytes as f64);
        let direct = profile(
            Algo::BroadcastDirect,
            &shape(Collective::Broadcast, bytes, 4),
            4,
            CHUNK,
        );
        // The two transfers in turn, each at the sender's share, weigh less than the root's
        // three sends of direct, also at the sender's share.
        assert!(loopback.terms(&tree, 4)[2] < loopback.terms(&direct, 4)[2]);
        // 4 ranks of 2 cores at 512 KiB and 1 MiB (docs/perf/algorithms.md, twenty-fifth
        // session): the tree took 266 and 637 us, direct 299 and 680 (Intel Xeon, 19:58 run of
        // the twenty-fourth session); the tree 245 and 456, direct 257 and 628 (AMD EPYC). With
        // each stage counted at its full bytes, direct was picked at both.
        for bytes in [512 << 10, 1 << 20] {
            let a = pick(&loopback, Collective::Broadcast, bytes, 4);
            assert_eq!(a, Algo::BroadcastTree, "{bytes} B broadcast on 4 ranks");
        }
    }

    #[test]
    fn a_chain_below_one_chunk_moves_the_buffer_once_per_hop() {
        let bcast = |bytes| shape(Collective::Broadcast, bytes, 4);
        // One piece: the 3 hops of 4 ranks run in turn.
        let f = profile(Algo::BroadcastChain, &bcast(256 << 10), 4, CHUNK);
        assert_eq!(f.path, 3.0 * f64::from(256u32 << 10));
        // 64 pieces: the pipeline's fill adds 2 pieces to the buffer.
        let f = profile(Algo::BroadcastChain, &bcast(64 << 20), 4, CHUNK);
        assert_eq!(f.path, 66.0 * f64::from(1u32 << 20));
        // Below a chunk the model now ranks the tree's 2 hops ahead of the chain's 3 (measured
        // either way from run to run at 128-512 KiB on 4 ranks, docs/perf/algorithms.md).
        let a = pick(&measured(4), Collective::Broadcast, 256 << 10, 4);
        assert_ne!(a, Algo::BroadcastChain, "256 KiB broadcast on 4 ranks");
    }

    #[test]
    fn scatter_and_gather_trees_stage_only_subtrees_of_several_blocks() {
        for (tree, direct, coll) in [
            (Algo::ScatterTree, Algo::ScatterDirect, Collective::Scatter),
            (Algo::GatherTree, Algo::GatherDirect, Collective::Gather),
        ] {
            // On 2 ranks the only child is a leaf: the tree sends what direct sends.
            let two = shape(coll, 512 << 10, 2);
            assert_eq!(
                profile(tree, &two, 2, CHUNK),
                profile(direct, &two, 2, CHUNK)
            );
            // On 8 ranks the root stages the blocks of its subtrees of 2 and 4 ranks.
            let f = profile(tree, &shape(coll, 8 << 10, 8), 8, CHUNK);
            assert_eq!(f.copied, f64::from(6u32 << 10), "{coll:?}");
        }
    }

    /// Bruck's copies run on every rank at once: with 8 ranks on 2 cores they cost 4 times the
    /// gamma of one rank, with 2 ranks on 2 cores once; other algorithms' copies are not scaled.
    #[test]
    fn bruck_copies_share_the_cores() {
        let gamma_term = |algo: Algo, q: usize, n: usize| {
            let m = model(q);
            let f = profile(algo, &shape(Collective::AllToAll, 1 << 20, n), n, CHUNK);
            (m.terms(&f, n)[3], f.copied * m.gamma)
        };
        let (scaled, plain) = gamma_term(Algo::AllToAllBruck, 8, 8);
        assert!(plain > 0.0);
        assert!(
            (scaled - 4.0 * plain).abs() < 1e-12 * plain.max(1.0),
            "{scaled} vs {plain}"
        );
        let (scaled, plain) = gamma_term(Algo::AllToAllBruck, 2, 2);
        assert_eq!(scaled, plain);
        let m = model(8);
        let f = profile(
            Algo::ScatterTree,
            &shape(Collective::Scatter, 1 << 20, 8),
            8,
            CHUNK,
        );
        assert!(f.copied > 0.0);
        assert_eq!(m.terms(&f, 8)[3], (f.reduced + f.copied) * m.gamma);
    }
}
