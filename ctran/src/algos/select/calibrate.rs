//! Measuring the cost model at communicator creation, and agreeing on it.
//!
//! Runs on the progress thread before the first operation, over the communicator's own
//! transport, in three parts:
//! 1. a ring all_gather of a small record per rank (host, cores, whether it wants a
//!    measurement), from which every rank derives the same ranks-per-host and cores-per-host;
//! 2. unless every parameter is configured on every rank, a short measurement in which all ranks
//!    at once exchange messages with their ring neighbours, after two barriers so that they start
//!    together: `PING_ROUNDS` empty round trips between rank pairs (alpha, the hop latency),
//!    `FAN_ROUNDS` rounds of an empty message to each of the next `FAN` ranks (mu, the CPU cost
//!    of a message), `BETA_ROUNDS` ring exchanges of `BETA_BYTES` (beta), each after an untimed
//!    round (page faults, socket buffers growing); the median round trip, robust to a round that
//!    lost the CPU, and the mean of the exchanges, whose rounds overlap; and a local reduction of
//!    `BETA_BYTES` (about 10 ms in all with 8 ranks on 2 loaded cores, well under 50 ms);
//! 3. ring all_reduces of the parameters (configured values where given), so every rank holds
//!    bitwise the same model and auto picks the same algorithm everywhere: the maximum of alpha,
//!    mu and gamma, so that the slowest link (and the slowest transport) sets them, and the mean
//!    of beta (see [`agree`]).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use crate::algos::all_gather;
use crate::algos::all_reduce;
use crate::algos::barrier;
use crate::algos::ctx::OpCtx;
use crate::algos::select::{CostModel, CostOverrides};
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Round trips timed for alpha.
const PING_ROUNDS: usize = 8;
/// Most peers of the fan-out round timed for mu.
const FAN: usize = 4;
/// Fan-out rounds timed for mu.
const FAN_ROUNDS: usize = 5;
/// Exchanges of `BETA_BYTES` timed for beta.
const BETA_ROUNDS: usize = 3;
/// Message size of the bandwidth measurement.
const BETA_BYTES: usize = 256 << 10;
/// Bytes of one rank's record.
const RECORD: usize = 24;

/// The machine this rank runs on, for counting the ranks that share its cores. Unlike
/// `comm::host_id` it leaves out the network namespace: ranks in namespaces of one machine are
/// separate hosts to the transports but compete for the same cores.
fn host_id() -> u64 {
    let mut h = DefaultHasher::new();
    nix::unistd::gethostname()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
        .hash(&mut h);
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap_or_default()
        .hash(&mut h);
    h.finish()
}

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: every caller keeps `v` alive and untouched until the operation using the span
    // returned (they run synchronously on this thread).
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Mean seconds of `rounds` runs of `round`, after one untimed run (fresh buffers fault their
/// pages in, socket buffers grow). For exchanges whose rounds do not wait for each other (sends
/// are buffered, a rank may run ahead): only their total time measures the throughput.
fn mean_of(rounds: usize, mut round: impl FnMut() -> Result<()>) -> Result<f64> {
    round()?;
    let t0 = Instant::now();
    for _ in 0..rounds {
        round()?;
    }
    Ok(t0.elapsed().as_secs_f64() / rounds.max(1) as f64)
}

/// The median of `rounds` timings of `round`, after one untimed run; for rounds that are
/// synchronous by themselves (round trips). On a shared host a round now and then loses the CPU
/// for a scheduler tick (milliseconds, against microseconds for a message), which would drag a
/// mean of a few rounds far from the typical round.
fn median_of(rounds: usize, mut round: impl FnMut() -> Result<()>) -> Result<f64> {
    round()?;
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        round()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&mut times))
}

/// The median of `v` (the mean of the middle two for an even count; 0 when empty), sorting `v`
/// in place.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Mean seconds of one ring exchange of `bytes` (every rank sends right and receives from the
/// left) over `rounds`.
fn ring_exchange(cx: &mut OpCtx<'_>, bytes: usize, rounds: usize) -> Result<f64> {
    let (n, r) = (cx.size, cx.rank);
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let mut out = vec![0u8; bytes];
    let mut inc = vec![0u8; bytes];
    let (o, i) = (span_of(&mut out), span_of(&mut inc));
    mean_of(rounds, || cx.sendrecv(right, o, left, i))
}

/// Median seconds of one empty-message round trip between partners `r` and `r ^ 1`, all pairs
/// at once; `None` on a rank without a partner (the last of an odd count).
fn ping_pong(cx: &mut OpCtx<'_>, rounds: usize) -> Result<Option<f64>> {
    let peer = cx.rank ^ 1;
    if peer >= cx.size {
        return Ok(None);
    }
    let first = cx.rank < peer;
    median_of(rounds, || {
        if first {
            let s = cx.send(peer, Span::EMPTY)?;
            let r = cx.recv(peer, Span::EMPTY)?;
            cx.wait(r)?;
            cx.wait(s)?;
        } else {
            let r = cx.recv(peer, Span::EMPTY)?;
            cx.wait(r)?;
            let s = cx.send(peer, Span::EMPTY)?;
            cx.wait(s)?;
        }
        Ok(())
    })
    .map(Some)
}

/// Mean seconds of one round in which every rank sends an empty message to each of the next
/// `k` ranks and receives one from each of the previous `k`.
fn fan_exchange(cx: &mut OpCtx<'_>, k: usize, rounds: usize) -> Result<f64> {
    let (n, r) = (cx.size, cx.rank);
    mean_of(rounds, || {
        let mut reqs = Vec::with_capacity(2 * k);
        for d in 1..=k {
            reqs.push(cx.recv((r + n - d) % n, Span::EMPTY)?);
        }
        for d in 1..=k {
            reqs.push(cx.send((r + d) % n, Span::EMPTY)?);
        }
        cx.wait_all(&mut reqs)
    })
}

/// Seconds per byte of an f32 sum on this core (best of three).
fn reduce_rate() -> f64 {
    let red = Reducer::new(DataType::F32, ReduceOp::Sum, 2).expect("f32 sum is valid");
    let mut dst = vec![1f32; BETA_BYTES / 4];
    let src = vec![2f32; BETA_BYTES / 4];
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        red.combine(
            bytemuck::cast_slice_mut(&mut dst),
            bytemuck::cast_slice(&src),
        );
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    best / BETA_BYTES as f64
}

/// The parameters every rank uses, from each rank's `[alpha, mu, beta, gamma]`: the maximum of
/// alpha, mu and gamma, and the mean of beta. The ring exchanges that beta comes from overlap,
/// so a rank's own time depends on when it left the barrier: one that leaves late finds its data
/// waiting, one that leaves early waits for its neighbour. With 8 ranks on 2 cores one
/// calibration measured between -0.2 and 5.6 ns/B on different ranks, a mean of 2.1, while large
/// collectives move about 2.6 ns/B per rank there: the maximum took the unluckiest phase. A slow
/// link still shows in the mean, since it holds up the whole ring.
fn agree(cx: &mut OpCtx<'_>, local: [f64; 4]) -> Result<[f64; 4]> {
    let [alpha, mu, beta, gamma] = local;
    let mut most = [alpha, mu, gamma];
    all_reduce::ring::run(cx, span_of(&mut most), DataType::F64, ReduceOp::Max)?;
    let mut mean = [beta];
    all_reduce::ring::run(cx, span_of(&mut mean), DataType::F64, ReduceOp::Avg)?;
    Ok([most[0], most[1], mean[0], most[2]])
}

/// Measures (where not configured) and agrees on the cost model; every rank of the
/// communicator must call it at the same point of its operation stream.
pub fn run(cx: &mut OpCtx<'_>, given: &CostOverrides) -> Result<CostModel> {
    let start = Instant::now();
    let n = cx.size;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as u64;
    let mut mine = [0u8; RECORD];
    mine[0..8].copy_from_slice(&host_id().to_le_bytes());
    mine[8..16].copy_from_slice(&cores.to_le_bytes());
    mine[16..24].copy_from_slice(&u64::from(!given.complete()).to_le_bytes());
    let mut all = vec![0u8; RECORD * n];
    let out = span_of(&mut all);
    let outputs: Vec<Span> = (0..n).map(|i| out.sub(i * RECORD, RECORD)).collect();
    all_gather::ring::run(cx, span_of(&mut mine), &outputs)?;
    let word =
        |rec: &[u8], at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().expect("8 bytes"));
    let records: Vec<&[u8]> = all.chunks_exact(RECORD).collect();
    let mut hosts: Vec<u64> = records.iter().map(|rec| word(rec, 0)).collect();
    hosts.sort_unstable();
    let ranks_per_host = hosts
        .chunk_by(|a, b| a == b)
        .map(<[u64]>::len)
        .max()
        .unwrap_or(1);
    let cores_per_host = records.iter().map(|rec| word(rec, 8)).min().unwrap_or(1) as usize;
    let measure = n > 1 && records.iter().any(|rec| word(rec, 16) != 0);

    let defaults = CostModel::default();
    let (mut alpha, mut mu, mut beta, mut gamma) =
        (defaults.alpha, defaults.mu, defaults.beta, defaults.gamma);
    if measure {
        // Everyone in step first, so the timings do not include a late rank's start.
        barrier::dissemination::run(cx)?;
        barrier::dissemination::run(cx)?;
        // Hop latency: half a round trip, every pair at once (a rank without a partner has no
        // say; the agreement below takes the maximum).
        let rtt = ping_pong(cx, PING_ROUNDS)?;
        alpha = rtt.map_or(0.0, |t| t / 2.0);
        // CPU per message: a round in which every rank sends `fan` messages costs about alpha
        // plus the host's messages shared by its cores.
        let fan = (n - 1).min(FAN);
        let q = ranks_per_host.clamp(1, n) as f64;
        let cores = (cores_per_host.max(1) as f64).min(q);
        barrier::dissemination::run(cx)?;
        let wide = fan_exchange(cx, fan, FAN_ROUNDS)?;
        mu = ((wide - alpha) * cores / (q * fan as f64)).max(wide / 20.0);
        // Bandwidth with every rank moving data, beyond the cost of an empty round.
        let ring = alpha + q * mu / cores;
        barrier::dissemination::run(cx)?;
        let big = ring_exchange(cx, BETA_BYTES, BETA_ROUNDS)?;
        beta = (big - ring).max(big / 4.0) / BETA_BYTES as f64;
        gamma = reduce_rate();
    }
    if let Some(us) = given.alpha_us {
        alpha = us * 1e-6;
    }
    if let Some(us) = given.mu_us {
        mu = us * 1e-6;
    }
    if let Some(gbps) = given.beta_gbps {
        beta = 1.0 / (gbps * 1e9);
    }
    if let Some(gbps) = given.gamma_gbps {
        gamma = 1.0 / (gbps * 1e9);
    }
    let local = [alpha, mu, beta, gamma];
    let [alpha, mu, beta, gamma] = agree(cx, local)?;
    let model = CostModel {
        alpha,
        mu,
        beta,
        gamma,
        ranks_per_host,
        cores_per_host: cores_per_host.max(1),
        measured: measure,
    };
    tracing::debug!(
        rank = cx.rank,
        ?model,
        ?local,
        took_ms = start.elapsed().as_secs_f64() * 1e3,
        "cost model agreed"
    );
    Ok(model)
}
