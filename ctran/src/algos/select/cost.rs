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
//! - `B`: bytes a rank moves (the larger of sent and received), for the busiest rank and on
//!   average; `B_path`: bytes moved one transfer after another along a pipeline's critical path
//!   (its hops times its piece);
//!   beta is measured with every rank moving data at once, which on a host with more ranks than
//!   cores is `kappa = ranks per host / cores` times slower than a rank alone: a rank that works
//!   while others wait goes `kappa` times faster, but never faster than the host's cores allow
//!   for everyone's bytes;
//! - `R`: bytes reduced on the critical path, `P`: bytes copied through staging;
//! - the bytes term of a pipeline (ring, chain, tree) costs [`RING_STALL`] more on a host with
//!   more ranks than cores.
//!
//! alpha, mu, beta and gamma are measured on the communicator's own transport at creation
//! ([`calibrate`](super::calibrate)) or configured; the per-algorithm counts are below.

use crate::algos::pipe::pow2_floor;
use crate::algos::reduce_scatter::recursive_halving;
use crate::algos::select::{Algo, Shape};

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
    /// Bytes the busiest rank sends or receives (the larger), in time order: transfers that
    /// overlap count once.
    pub busiest: f64,
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
}

fn log2_ceil(n: usize) -> f64 {
    f64::from(usize::BITS - (n.max(1) - 1).leading_zeros())
}

/// Profile of `algo` for a call of `shape` on `n` ranks with staging chunks of `chunk` bytes.
pub fn profile(algo: Algo, shape: &Shape, n: usize, chunk: usize) -> Profile {
    use Algo::*;
    let s = shape.bytes as f64;
    if n <= 1 {
        return Profile::default();
    }
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
            f.busiest = 2.0 * (nf - 1.0) * b;
            f.total = nf * 2.0 * (nf - 1.0) * b;
            f.reduced = (nf - 1.0) * b;
        }
        AllReduceHalvingDoubling => {
            f.hops = 2.0 * lp + 2.0 * folded + (pcs(s / 2.0, c) - 1.0).max(0.0);
            f.messages = pf * 2.0 * lp + rem * 2.0;
            f.busiest = 2.0 * (pf - 1.0) / pf * s + folded * s;
            f.total = 2.0 * (pf - 1.0) * s + rem * 2.0 * s;
            f.reduced = (pf - 1.0) / pf * s + folded * s;
        }
        AllReduceDirect => {
            let k = pcs(s, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf * (nf - 1.0);
            f.busiest = (nf - 1.0) * s;
            f.total = nf * (nf - 1.0) * s;
            f.reduced = (nf - 1.0) * s;
            f.copied = 2.0 * s;
        }
        AllReduceTree => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = 2.0 * l + 2.0 * (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = 2.0 * (nf - 1.0) * k;
            f.busiest = l * s;
            f.total = 2.0 * (nf - 1.0) * s;
            f.reduced = l * s;
            f.copied = s;
        }
        AllGatherRing => {
            f.chained = true;
            let k = pcs(b, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(b, k);
            f.messages = nf * (nf - 1.0) * k;
            f.busiest = (nf - 1.0) * b;
            f.total = nf * (nf - 1.0) * b;
        }
        AllGatherRecursiveDoubling => {
            f.hops = lp + 2.0 * folded;
            f.messages = pf * lp + rem * 2.0;
            f.busiest = (pf - 1.0) / pf * s + folded * s / 2.0;
            f.total = (pf - 1.0) * s + rem * s;
        }
        AllGatherBruck => {
            // One transfer per rank in each of its ceil(log2 n) steps.
            f.messages = nf * l;
            f.hops += l;
            f.busiest = (nf - 1.0) * b;
            f.total = nf * (nf - 1.0) * b;
        }
        AllGatherDirect | AllToAllDirect => {
            f.hops = 1.0;
            f.messages = nf * (nf - 1.0);
            f.busiest = (nf - 1.0) * b;
            f.total = nf * (nf - 1.0) * b;
        }
        ReduceScatterRing => {
            f.chained = true;
            let k = pcs(b, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(b, k);
            f.messages = nf * (nf - 1.0) * k;
            f.busiest = (nf - 1.0) * b;
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
            f.busiest = (pf - 1.0) / pf * s + folded * s;
            f.total = (pf - 1.0) * s + rem * (s + b);
            f.reduced = (pf - 1.0) / pf * s + folded * s;
            f.copied = s;
        }
        ReduceScatterDirect => {
            let k = pcs(b, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf * (nf - 1.0);
            f.busiest = (nf - 1.0) * b;
            f.total = nf * (nf - 1.0) * b;
            f.reduced = (nf - 1.0) * b;
            f.copied = 2.0 * b;
        }
        BroadcastTree => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = l + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            f.busiest = l * s;
            f.total = (nf - 1.0) * s;
        }
        BroadcastChain => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = nf - 1.0 + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            f.busiest = s;
            f.total = (nf - 1.0) * s;
        }
        BroadcastDirect => {
            f.hops = 1.0;
            f.messages = nf - 1.0;
            f.busiest = (nf - 1.0) * s;
            f.total = (nf - 1.0) * s;
        }
        ReduceTree => {
            f.chained = true;
            let k = pcs(s, c);
            f.hops = l + (k - 1.0).max(0.0);
            f.path = f.hops * piece(s, k);
            f.messages = (nf - 1.0) * k;
            f.busiest = l * s;
            f.total = (nf - 1.0) * s;
            f.reduced = l * s;
            f.copied = s;
        }
        ReduceDirect => {
            let k = pcs(s, direct_piece);
            f.hops = k.max(1.0);
            f.messages = nf - 1.0;
            f.busiest = (nf - 1.0) * s;
            f.total = (nf - 1.0) * s;
            f.reduced = (nf - 1.0) * s;
            f.copied = 2.0 * s;
        }
        AllToAllPairwise => {
            f.hops += nf - 1.0;
            f.messages = nf * (nf - 1.0);
            f.busiest = (nf - 1.0) * b;
            f.total = nf * (nf - 1.0) * b;
        }
        AllToAllBruck => {
            f.hops += l;
            f.messages = nf * l;
            f.busiest = l * s / 2.0;
            f.total = nf * l * s / 2.0;
            f.copied = (l + 2.0) * s;
        }
        ScatterDirect | GatherDirect => {
            f.hops = 1.0;
            f.messages = nf - 1.0;
            f.busiest = (nf - 1.0) * b;
            f.total = (nf - 1.0) * b;
        }
        ScatterTree | GatherTree => {
            f.hops = l;
            f.messages = nf - 1.0;
            f.busiest = (nf - 1.0) * b;
            f.total = l * s / 2.0;
            f.copied = s;
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
        let bytes = stall * (f.busiest.max(f.path) / self.kappa(n)).max(f.total / nf);
        [
            f.hops * self.alpha,
            messages_host / cores * self.mu,
            bytes * self.beta,
            (f.reduced + f.copied) * self.gamma,
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
        // Large reduce_scatter: the ring where every rank has a core, not where 4 ranks share
        // 2 cores (direct measured 10-25% faster there from 2 MiB on).
        let a = pick(&model(2), Collective::ReduceScatter, 16 << 20, 2);
        assert_eq!(
            a,
            Algo::ReduceScatterRing,
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
}
