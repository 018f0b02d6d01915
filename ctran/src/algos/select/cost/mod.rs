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

mod counts;
#[cfg(test)]
mod tests;

use crate::algos::select::{Algo, Shape};
pub use counts::{profile, Load, Profile};

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
/// Measured on a 2-core machine, one process streaming 2 GiB to another in 256 KiB-1 MiB
/// writes: the sender used 0.28-0.66 s of CPU, the receiver 0.20-0.26 s, a share of 0.58-0.72
/// (docs/perf/algorithms.md).
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
