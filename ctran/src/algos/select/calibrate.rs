//! Measuring the cost model at communicator creation, and agreeing on it.
//!
//! Runs while `Comm::init` waits (so the caller's start-up work does not compete with it), over
//! the communicator's own transport, as [`Steps`]: each step is handed to the progress thread and
//! back the way an operation is, so that what is timed includes what the caller's collectives
//! pay. In three parts:
//! 1. a ring all_gather of a small record per rank (host, cores, whether it wants a
//!    measurement), from which every rank derives the same ranks-per-host and cores-per-host;
//! 2. unless every parameter is configured on every rank, a short measurement, after two
//!    barriers so that all ranks start together:
//!    - alpha (per hop) and mu (per message) are fitted to three tiny collectives: a tree
//!      all_reduce (a chain of `2 log n` hops), the dissemination barrier and a direct all_gather
//!      (one hop, `n(n-1)` messages), less the cost of handing an empty step over and back (the
//!      same for every algorithm). Each is timed from the caller in `PROBE_PASSES` passes of
//!      `PROBE_ROUNDS` rounds (the median of all rounds, robust to rounds that lost the CPU) and
//!      agreed as the slowest rank's time. Every rank fits the same agreed times
//!      ([`fit_latency`]), so it holds the same alpha and mu;
//!    - beta from `BETA_ROUNDS` ring exchanges of `BETA_BYTES` after an untimed one (page faults,
//!      socket buffers growing), less the cost of an empty exchange;
//!    - gamma from a local reduction of `BETA_BYTES`;
//!
//!    13-18 ms in all with 4 ranks on 2 cores, 28-43 ms with 8;
//! 3. ring all_reduces of the parameters (configured values where given), so every rank holds
//!    bitwise the same model and auto picks the same algorithm everywhere (see [`agree`]).

use std::time::Instant;

use crate::algos::all_gather;
use crate::algos::all_reduce;
use crate::algos::barrier;
use crate::algos::ctx::OpCtx;
use crate::algos::select::{cost, Algo, Collective, CostModel, CostOverrides, Shape};
use crate::comm::stable_hash::StableHasher;
use crate::error::Result;
use crate::kernels::Reducer;
use crate::span::Span;
use crate::types::{DataType, ReduceOp};

/// Passes over the tiny collectives that alpha and mu are fitted to.
const PROBE_PASSES: usize = 3;
/// Rounds timed of each tiny collective in a pass.
const PROBE_ROUNDS: usize = 7;
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
    let host = nix::unistd::gethostname()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    StableHasher::new().str(&host).str(&boot).finish()
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

/// Seconds of each of `rounds` runs of `round`, after one untimed run; for rounds that are
/// synchronous by themselves (collectives of a few bytes), whose median is the typical round:
/// on a shared host a round now and then loses the CPU for a scheduler tick (milliseconds,
/// against microseconds for a message), which would drag a mean of a few rounds far from it.
fn times_of(rounds: usize, mut round: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    round()?;
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        round()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(times)
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

/// The tiny collectives that alpha and mu are fitted to. Between them they span the mix of hops
/// and messages of the algorithms: a tree all_reduce is a chain of `2 log n` hops with `2(n-1)`
/// messages, in which most ranks wait at any time; the dissemination barrier has `log n` hops in
/// which every rank sends; a direct all_gather has one hop and `n(n-1)` messages. On a host with
/// more ranks than cores a hop that wakes a waiting rank costs several times half an isolated
/// round trip (the waiting rank has to get a core that another rank may hold), which only
/// collectives like these show.
const PROBES: [Algo; 3] = [
    Algo::AllReduceTree,
    Algo::BarrierDissemination,
    Algo::AllGatherDirect,
];

/// The call of `probe` that is timed: 8 bytes for the all_reduce, one byte per rank for the
/// all_gather.
fn probe_shape(probe: Algo, n: usize) -> Shape {
    let (bytes, max_block, elem) = match probe.collective() {
        Collective::AllReduce => (8, 8, 4),
        Collective::AllGather => (n, 1, 1),
        _ => (0, 0, 1),
    };
    Shape {
        collective: probe.collective(),
        bytes,
        max_block,
        equal: true,
        elem,
        uniform: true,
    }
}

/// One run of `probe`: 8 bytes of all_reduce, one byte per rank of all_gather, a barrier.
fn run_probe(cx: &mut OpCtx<'_>, probe: Algo) -> Result<()> {
    match probe {
        Algo::AllReduceTree => {
            let mut sum = [1f32; 2];
            all_reduce::tree::run(cx, span_of(&mut sum), DataType::F32, ReduceOp::Sum)
        }
        Algo::AllGatherDirect => {
            let mut mine = [0u8; 1];
            let mut all = vec![0u8; cx.size];
            let out = span_of(&mut all);
            let outputs: Vec<Span> = (0..cx.size).map(|i| out.sub(i, 1)).collect();
            all_gather::direct::run(cx, span_of(&mut mine), &outputs)
        }
        _ => barrier::dissemination::run(cx),
    }
}

/// Runs the calibration's steps on the communicator's progress thread, each handed over and
/// back the way the caller's operations are: a collective the caller waits for costs it two
/// thread hand-offs besides the collective, and on a host with more threads than cores the
/// collective itself runs alongside the callers' threads, which a measurement on the progress
/// thread alone would miss.
pub trait Steps {
    /// This rank and the number of ranks.
    fn rank_size(&self) -> (usize, usize);

    /// Runs `step` on the progress thread and returns its result once it finished; an error
    /// there has failed the communicator.
    fn run<T: Send + 'static>(
        &mut self,
        step: impl FnOnce(&mut OpCtx<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T>;
}

/// A timed probe as the model sees it: the seconds that one unit of alpha and one unit of mu
/// add to it ([`CostModel::time`]), and the seconds it took.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// Seconds per second of alpha: the probe's hops.
    pub per_alpha: f64,
    /// Seconds per second of mu: its messages per core.
    pub per_mu: f64,
    /// Measured seconds.
    pub secs: f64,
}

impl Probe {
    /// `probe` on `n` ranks, at most `ranks_per_host` of them on a host of `cores_per_host`
    /// cores, measured at `secs`: its coefficients come from the model's own accounting.
    fn new(
        probe: Algo,
        n: usize,
        ranks_per_host: usize,
        cores_per_host: usize,
        secs: f64,
    ) -> Probe {
        let f = cost::profile(probe, &probe_shape(probe, n), n, usize::MAX);
        let unit = |alpha: f64, mu: f64| {
            CostModel {
                alpha,
                mu,
                beta: 0.0,
                gamma: 0.0,
                send_share: None,
                ranks_per_host,
                cores_per_host: cores_per_host.max(1),
                measured: true,
            }
            .time(&f, n)
        };
        Probe {
            per_alpha: unit(1.0, 0.0),
            per_mu: unit(0.0, 1.0),
            secs,
        }
    }
}

/// Least alpha and mu, in seconds.
const LATENCY_FLOOR: f64 = 1e-7;

/// Alpha and mu (seconds per hop and per message) that best explain `probes`, by least
/// squares; a parameter given in `alpha` or `mu` is kept and only the other fitted. Neither goes
/// below [`LATENCY_FLOOR`] (a host where messages cost nothing measurable could fit a negative
/// one); then the other is fitted alone.
pub fn fit_latency(probes: &[Probe], alpha: Option<f64>, mu: Option<f64>) -> (f64, f64) {
    let per_alpha = |p: &Probe| p.per_alpha;
    let per_mu = |p: &Probe| p.per_mu;
    // The coefficient of `x` that fits the probes with the other one's `fixed` part removed.
    let alone = |x: fn(&Probe) -> f64, other: fn(&Probe) -> f64, fixed: f64| {
        let (xt, xx) = probes.iter().fold((0.0, 0.0), |(xt, xx), p| {
            (xt + x(p) * (p.secs - other(p) * fixed), xx + x(p) * x(p))
        });
        if xx > 0.0 {
            (xt / xx).max(LATENCY_FLOOR)
        } else {
            LATENCY_FLOOR
        }
    };
    match (alpha, mu) {
        (Some(a), Some(m)) => (a, m),
        (Some(a), None) => (a, alone(per_mu, per_alpha, a)),
        (None, Some(m)) => (alone(per_alpha, per_mu, m), m),
        (None, None) => match least_squares(probes) {
            Some((a, m)) if a >= LATENCY_FLOOR && m >= LATENCY_FLOOR => (a, m),
            Some((a, _)) if a >= LATENCY_FLOOR => {
                (alone(per_alpha, per_mu, LATENCY_FLOOR), LATENCY_FLOOR)
            }
            _ => (LATENCY_FLOOR, alone(per_mu, per_alpha, LATENCY_FLOOR)),
        },
    }
}

/// The unconstrained least-squares (alpha, mu) of `probes`; `None` when the probes cannot tell
/// the two apart.
fn least_squares(probes: &[Probe]) -> Option<(f64, f64)> {
    let (mut aa, mut am, mut mm, mut at, mut mt) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in probes {
        aa += p.per_alpha * p.per_alpha;
        am += p.per_alpha * p.per_mu;
        mm += p.per_mu * p.per_mu;
        at += p.per_alpha * p.secs;
        mt += p.per_mu * p.secs;
    }
    let det = aa * mm - am * am;
    (det > 1e-9 * aa * mm).then(|| ((at * mm - mt * am) / det, (mt * aa - at * am) / det))
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

/// The parameters every rank uses, from each rank's `[alpha, mu, beta, gamma, send share]` (a
/// share of 0 for none): the maximum of alpha, mu, gamma and the share, and the mean of beta.
/// Measured alpha and mu are equal on every rank already (fitted to agreed probe times); the
/// maximum matters where some ranks configured them.
/// The ring exchanges that beta comes from overlap, so a rank's own time depends on when it left
/// the barrier: one that leaves late finds its data waiting, one that leaves early waits for its
/// neighbour. On a host with more ranks than cores the ranks' own values scatter widely around
/// what large collectives move per byte, and the maximum would take the unluckiest phase; the
/// mean stays close. A slow link still shows in the mean, since it holds up the whole ring.
fn agree(cx: &mut OpCtx<'_>, local: [f64; 5]) -> Result<[f64; 5]> {
    let [alpha, mu, beta, gamma, share] = local;
    let mut most = [alpha, mu, gamma, share];
    all_reduce::ring::run(cx, span_of(&mut most), DataType::F64, ReduceOp::Max)?;
    let mut mean = [beta];
    all_reduce::ring::run(cx, span_of(&mut mean), DataType::F64, ReduceOp::Avg)?;
    Ok([most[0], most[1], mean[0], most[2], most[3]])
}

/// Times the [`PROBES`] and an empty step, and agrees on each one's time: the slowest rank's,
/// which is how long the collective took. A rank's time is the median of its rounds of all
/// passes: with 2 ranks one pass of a probe lasts only tens of microseconds, and one disturbance
/// of a few hundred could cover all its rounds of a single pass; spread over passes, it covers
/// a third of them. Not the fastest pass: on a host with more ranks than cores the tree's passes
/// vary most, by several times, so its fastest would understate hops against the others.
/// Returns the probes' seconds and the empty step's.
fn measure_probes(steps: &mut impl Steps) -> Result<([f64; PROBES.len()], f64)> {
    let mut rounds: [Vec<f64>; PROBES.len() + 1] = Default::default();
    for _ in 0..PROBE_PASSES {
        let (empty, probes) = rounds.split_last_mut().expect("probes");
        empty.extend(times_of(PROBE_ROUNDS, || steps.run(|_| Ok(())))?);
        for (times, &probe) in probes.iter_mut().zip(&PROBES) {
            steps.run(barrier::dissemination::run)?;
            times.extend(times_of(PROBE_ROUNDS, || {
                steps.run(move |cx| run_probe(cx, probe))
            })?);
        }
    }
    let mut secs = rounds.map(|mut times| median(&mut times));
    secs = steps.run(move |cx| {
        all_reduce::ring::run(cx, span_of(&mut secs), DataType::F64, ReduceOp::Max)?;
        Ok(secs)
    })?;
    let (&empty, probes) = secs.split_last().expect("probes");
    Ok((probes.try_into().expect("one time per probe"), empty))
}

/// What the ranks tell each other first: (ranks per host, cores per host, whether any rank wants
/// a measurement).
fn exchange_records(
    cx: &mut OpCtx<'_>,
    host_cores: usize,
    wants_measurement: bool,
) -> Result<(usize, usize, bool)> {
    let n = cx.size;
    let mut mine = [0u8; RECORD];
    mine[0..8].copy_from_slice(&host_id().to_le_bytes());
    mine[8..16].copy_from_slice(&(host_cores.max(1) as u64).to_le_bytes());
    mine[16..24].copy_from_slice(&u64::from(wants_measurement).to_le_bytes());
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
    let wanted = records.iter().any(|rec| word(rec, 16) != 0);
    Ok((ranks_per_host, cores_per_host.max(1), wanted))
}

/// Measures (where not configured) and agrees on the cost model; every rank of the
/// communicator must call it before its first operation. `host_cores`: the cores this rank's
/// host gives the communicator's ranks on it (the union of their CPU sets); `local_tcp`: ranks of
/// one host talk over TCP (no shared memory).
pub fn run(
    steps: &mut impl Steps,
    given: &CostOverrides,
    host_cores: usize,
    local_tcp: bool,
) -> Result<CostModel> {
    let start = Instant::now();
    let (rank, n) = steps.rank_size();
    let wants = !given.complete();
    let (ranks_per_host, cores_per_host, wanted) =
        steps.run(move |cx| exchange_records(cx, host_cores, wants))?;
    let measure = n > 1 && wanted;

    let defaults = CostModel::default();
    let given_alpha = given.alpha_us.map(|us| us * 1e-6);
    let given_mu = given.mu_us.map(|us| us * 1e-6);
    let (mut alpha, mut mu) = (
        given_alpha.unwrap_or(defaults.alpha),
        given_mu.unwrap_or(defaults.mu),
    );
    let (mut beta, mut gamma) = (defaults.beta, defaults.gamma);
    let (mut probe_secs, mut empty_secs) = ([0.0; PROBES.len()], 0.0);
    if measure {
        // Everyone in step first, so the timings do not include a late rank's start.
        steps.run(|cx| {
            barrier::dissemination::run(cx)?;
            barrier::dissemination::run(cx)
        })?;
        (probe_secs, empty_secs) = measure_probes(steps)?;
        let probes: Vec<Probe> = PROBES
            .iter()
            .zip(probe_secs)
            .map(|(&algo, secs)| {
                let secs = (secs - empty_secs).max(0.0);
                Probe::new(algo, n, ranks_per_host, cores_per_host, secs)
            })
            .collect();
        (alpha, mu) = fit_latency(&probes, given_alpha, given_mu);
        // Bandwidth with every rank moving data, beyond the cost of an empty exchange (one hop,
        // one message per rank).
        let q = ranks_per_host.clamp(1, n) as f64;
        let cores = (cores_per_host as f64).min(q);
        let empty = alpha + q * mu / cores;
        let big = steps.run(|cx| {
            barrier::dissemination::run(cx)?;
            ring_exchange(cx, BETA_BYTES, BETA_ROUNDS)
        })?;
        beta = (big - empty).max(big / 4.0) / BETA_BYTES as f64;
        gamma = reduce_rate();
    }
    if let Some(gbps) = given.beta_gbps {
        beta = 1.0 / (gbps * 1e9);
    }
    if let Some(gbps) = given.gamma_gbps {
        gamma = 1.0 / (gbps * 1e9);
    }
    let share = if local_tcp && ranks_per_host > 1 {
        cost::LOOPBACK_SEND_SHARE
    } else {
        0.0
    };
    let local = [alpha, mu, beta, gamma, share];
    let [alpha, mu, beta, gamma, share] = steps.run(move |cx| agree(cx, local))?;
    let model = CostModel {
        alpha,
        mu,
        beta,
        gamma,
        send_share: (share > 0.0).then_some(share),
        ranks_per_host,
        cores_per_host,
        measured: measure,
    };
    tracing::debug!(
        rank,
        ?model,
        ?local,
        ?probe_secs,
        empty_secs,
        took_ms = start.elapsed().as_secs_f64() * 1e3,
        "cost model agreed"
    );
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probes' counts on `n` ranks of one host of 2 cores, with the seconds that a model of
    /// `alpha` and `mu` (and `noise` added to the last probe) predicts.
    fn probes(n: usize, alpha: f64, mu: f64, noise: f64) -> Vec<Probe> {
        let mut out: Vec<Probe> = PROBES
            .iter()
            .map(|&algo| {
                let p = Probe::new(algo, n, n, 2, 0.0);
                Probe {
                    secs: p.per_alpha * alpha + p.per_mu * mu,
                    ..p
                }
            })
            .collect();
        out.last_mut().expect("probes").secs += noise;
        out
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    #[test]
    fn the_probes_tell_hops_from_messages() {
        for n in [2, 3, 4, 5, 8, 9, 16] {
            let (a, m) = fit_latency(&probes(n, 20e-6, 5e-6, 0.0), None, None);
            assert!(close(a, 20e-6) && close(m, 5e-6), "{n} ranks: {a} {m}");
        }
    }

    #[test]
    fn a_configured_parameter_stays_and_the_other_is_fitted() {
        let p = probes(4, 20e-6, 5e-6, 0.0);
        let (a, m) = fit_latency(&p, Some(20e-6), None);
        assert!(a == 20e-6 && close(m, 5e-6), "{a} {m}");
        let (a, m) = fit_latency(&p, None, Some(5e-6));
        assert!(close(a, 20e-6) && m == 5e-6, "{a} {m}");
        assert_eq!(fit_latency(&p, Some(1.0), Some(2.0)), (1.0, 2.0));
    }

    #[test]
    fn a_fit_below_the_floor_refits_the_other_alone() {
        // Messages free, hops only: a noisy direct all_gather pushes mu below zero.
        let p = probes(8, 30e-6, 0.0, -20e-6);
        assert!(least_squares(&p).is_some_and(|(_, m)| m < 0.0));
        let (a, m) = fit_latency(&p, None, None);
        assert_eq!(m, LATENCY_FLOOR);
        assert!(a > 20e-6 && a < 40e-6, "{a}");
        // Nothing measurable at all.
        let (a, m) = fit_latency(&probes(4, 0.0, 0.0, 0.0), None, None);
        assert_eq!((a, m), (LATENCY_FLOOR, LATENCY_FLOOR));
    }
}
