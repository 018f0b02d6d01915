//! Every algorithm of every collective, chosen explicitly per call, checked against a reference
//! over each transport between ranks of one host (ranks are threads of this process): real TCP
//! on loopback (tests `*_over_tcp`, rank counts 1 to 9 and 16) and shared memory (`*_over_shm`,
//! rank counts 2 to 9, see [`SHM_RANKS`]) and ib over ibverbx's software fabric (`*_over_ib`,
//! the mapper routing every peer through the ib transport, see [`IB_RANKS`]), with sizes 0, 1, odd and large (staging chunks
//! of 4 KiB, so large messages run the chunked and pipelined paths), every (dtype, op) pair at
//! small sizes and a few at large ones; all_reduce results are compared byte for byte across
//! ranks. Each rank's trace (colltrace) must show every algorithm of the collective run, and every
//! collective started over the transport the test names. Then selection: configuration, hints,
//! errors that list the valid names, and auto agreeing on every rank.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctran::algos::select::{AlgoConfig, Choice, Collective, Hints};
use ctran::bootstrap::HashStore;
use ctran::kernels::Reducer;
use ctran::transport::ib::IbProvider;
use ctran::{Comm, CommConfig, DataType, Op, ReduceOp, Span};

const CHUNK: usize = 4096;
const RANKS: [usize; 10] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 16];

/// Rank counts of the matrix over shared memory: every count of [`RANKS`] but 1 (no peer to
/// share memory with) and 16: sixteen ranks as threads over shared memory on a loaded 2-core
/// machine cost as much as 2 to 9 together (the shm tests took about 11 s without 16 and 23 s
/// with it; the whole file 30 s over TCP alone, 46 s with this list, 60 s with 16), and odd,
/// even, power-of-two and other counts are all here.
const SHM_RANKS: [usize; 8] = [2, 3, 4, 5, 6, 7, 8, 9];

/// Rank counts of the matrix over ib (the software fabric): two, odd, even and a power of two.
/// The ib transport's own tests cover its protocol; these check that the mapper routes every
/// algorithm through it.
const IB_RANKS: [usize; 4] = [2, 3, 4, 5];

/// Records each rank's trace keeps: more than any matrix test runs on one communicator, so that
/// the check of the algorithms that ran sees every operation.
const TRACE_RECORDS: usize = 1 << 14;

/// Serialises environment reads and writes within this test binary.
static ENV: Mutex<()> = Mutex::new(());

/// What carries an explicitly chosen algorithm's messages between the ranks (all on this host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// TCP on loopback (`CTRAN_BACKENDS=socket`).
    Tcp,
    /// Shared memory: with `use_shm` the mapper routes every peer on this host through the
    /// shm transport's FIFOs (`CTRAN_BACKENDS=socket,shm`; an explicit algorithm never takes
    /// the shared-memory collectives).
    Shm,
    /// ib over the process's software fabric (`CTRAN_BACKENDS=socket,ib`,
    /// `CTRAN_IB_PROVIDER=soft`): the mapper routes every peer through the ib transport.
    Ib,
}

impl Transport {
    /// The transport as colltrace names it (`CommDump::transport`, `Record::transport`).
    fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "socket",
            Transport::Shm => "shm",
            Transport::Ib => "ib",
        }
    }

    /// Rank counts the matrix runs on over this transport.
    fn ranks(self) -> &'static [usize] {
        match self {
            Transport::Tcp => &RANKS,
            Transport::Shm => &SHM_RANKS,
            Transport::Ib => &IB_RANKS,
        }
    }
}

/// [`with_ranks`] over transport `t`; before finalizing, each rank checks its trace: the
/// communicator is connected over `t` alone, every collective that started ran over it, and
/// every algorithm of each of `colls` ran at least once.
fn with_ranks_over<R: Send>(
    t: Transport,
    colls: &[Collective],
    n: usize,
    name: &str,
    f: impl Fn(&Comm) -> R + Sync,
) -> Vec<R> {
    with_ranks(
        n,
        &format!("{name}-{}", t.name()),
        |cfg| {
            cfg.use_shm = t == Transport::Shm;
            cfg.want_ib = t == Transport::Ib;
            cfg.ib_provider = IbProvider::Soft;
            cfg.trace.buffer_size = TRACE_RECORDS;
        },
        |c| {
            let r = f(c);
            assert_ran_over(c, t, colls);
            r
        },
    )
}

/// See [`with_ranks_over`].
fn assert_ran_over(c: &Comm, t: Transport, colls: &[Collective]) {
    let dump = c.trace().snapshot();
    let who = format!("rank {} of {}, over {}", c.rank(), c.size(), t.name());
    assert_eq!(
        dump.transport.as_deref(),
        Some(t.name()),
        "{who}: connected"
    );
    assert_eq!(dump.dropped, 0, "{who}: the trace dropped records");
    let mut ran = std::collections::BTreeSet::new();
    for rec in dump.records.iter().filter(|r| r.algorithm.is_some()) {
        assert_eq!(
            rec.transport.as_deref(),
            Some(t.name()),
            "{who}: {} (seq {}) with {:?}",
            rec.op,
            rec.seq,
            rec.algorithm
        );
        ran.insert((rec.op.clone(), rec.algorithm.clone().unwrap_or_default()));
    }
    for &coll in colls {
        for algo in algos(coll) {
            assert!(
                ran.contains(&(coll.name().to_string(), algo.to_string())),
                "{who}: {} with {algo} never ran; ran {ran:?}",
                coll.name()
            );
        }
    }
}

fn with_ranks<R: Send>(
    n: usize,
    name: &str,
    tweak: impl Fn(&mut CommConfig) + Sync,
    f: impl Fn(&Comm) -> R + Sync,
) -> Vec<R> {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = Arc::clone(&store);
                let (f, tweak) = (&f, &tweak);
                s.spawn(move || {
                    let mut cfg = {
                        let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
                        CommConfig::from_env(format!("{name}-n{n}"), rank, n).unwrap()
                    };
                    cfg.timeout = Duration::from_secs(60);
                    cfg.chunk_bytes = CHUNK;
                    // These tests are about the generic algorithms, over TCP.
                    cfg.use_shm = false;
                    tweak(&mut cfg);
                    let comm = Comm::init(cfg, store).unwrap();
                    let r = f(&comm);
                    comm.finalize().unwrap();
                    r
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn span_of(v: &mut [u8]) -> Span {
    // SAFETY: every test waits for its operation before touching or dropping the vector.
    unsafe { Span::from_slice(v) }
}

/// Runs `op` with the algorithm `algo` and waits.
fn run(c: &Comm, op: Op, algo: &str) {
    run_with(c, op, Hints::from(Some(algo)));
}

/// Runs `op` with `algo`, the caller declaring equal blocks on every rank (all_to_all_single).
fn run_uniform(c: &Comm, op: Op, algo: &str) {
    run_with(
        c,
        op,
        Hints {
            algo: Some(algo),
            uniform: true,
        },
    );
}

fn run_with(c: &Comm, op: Op, hints: Hints<'_>) {
    let what = format!(
        "{} with {:?} on rank {} of {}",
        op.name(),
        hints.algo,
        c.rank(),
        c.size()
    );
    c.submit_with_options(op, None, Vec::new(), hints, None)
        .wait_timeout(Duration::from_secs(60), c.rank())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

// ---------------------------------------------------------------------------------------------
// Values: inputs chosen so that every reduction is exact in every dtype (sums of at most 16
// values in [-3, 3], products of mostly ones), except float AVG, checked with a tolerance.

fn signed(d: DataType) -> bool {
    !matches!(d, DataType::U8 | DataType::Bool)
}

fn input(d: DataType, op: ReduceOp, rank: usize, i: usize) -> f64 {
    if d == DataType::Bool {
        return ((rank * 5 + i * 3) % 3 == 0) as u8 as f64;
    }
    match op {
        ReduceOp::Product => match (rank * 7 + i * 3) % 11 {
            0 => 2.0,
            5 if signed(d) => -1.0,
            _ => 1.0,
        },
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => ((rank * 37 + i * 11) % 100) as f64,
        _ if signed(d) => ((rank * 5 + i * 3) % 7) as f64 - 3.0,
        _ => ((rank * 5 + i * 3) % 4) as f64,
    }
}

fn encode(d: DataType, v: f64, out: &mut Vec<u8>) {
    match d {
        DataType::F16 => out.extend(half::f16::from_f64(v).to_le_bytes()),
        DataType::BF16 => out.extend(half::bf16::from_f64(v).to_le_bytes()),
        DataType::F32 => out.extend((v as f32).to_le_bytes()),
        DataType::F64 => out.extend(v.to_le_bytes()),
        DataType::I8 => out.extend((v as i8).to_le_bytes()),
        DataType::U8 => out.push(v as u8),
        DataType::I32 => out.extend((v as i32).to_le_bytes()),
        DataType::I64 => out.extend((v as i64).to_le_bytes()),
        _ => out.push(u8::from(v != 0.0)),
    }
}

fn decode(d: DataType, b: &[u8]) -> f64 {
    match d {
        DataType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DataType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DataType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DataType::I8 => b[0] as i8 as f64,
        DataType::U8 | DataType::Bool => b[0] as f64,
        DataType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        _ => i64::from_le_bytes(b.try_into().unwrap()) as f64,
    }
}

fn inputs(d: DataType, op: ReduceOp, rank: usize, from: usize, count: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(count * d.size_bytes());
    for i in from..from + count {
        encode(d, input(d, op, rank, i), &mut v);
    }
    v
}

/// The reduction of element `i` over `ranks`.
fn expected(d: DataType, op: ReduceOp, n: usize, i: usize) -> f64 {
    let vals: Vec<f64> = (0..n).map(|r| input(d, op, r, i)).collect();
    if d == DataType::Bool {
        let any = vals.iter().any(|&v| v != 0.0);
        let all = vals.iter().all(|&v| v != 0.0);
        let odd = vals.iter().filter(|&&v| v != 0.0).count() % 2 == 1;
        return f64::from(u8::from(match op {
            ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd => all,
            ReduceOp::BXor => odd,
            _ => any,
        }));
    }
    let ints = || vals.iter().map(|&v| v as i64);
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Product => vals.iter().product(),
        ReduceOp::Min => vals.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Max => vals.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::BAnd => ints().fold(-1, |a, b| a & b) as f64,
        ReduceOp::BOr => ints().fold(0, |a, b| a | b) as f64,
        ReduceOp::BXor => ints().fold(0, |a, b| a ^ b) as f64,
        ReduceOp::Avg if d.is_float() => vals.iter().map(|v| v / n as f64).sum(),
        ReduceOp::Avg => (ints().sum::<i64>() / n as i64) as f64,
        ReduceOp::PremulSum { factor } => vals.iter().map(|v| v * factor).sum(),
    }
}

fn tolerance(d: DataType, op: ReduceOp) -> f64 {
    match (d, op) {
        (DataType::F16 | DataType::BF16, ReduceOp::Avg) => 0.05,
        (DataType::F32, ReduceOp::Avg) => 1e-5,
        (DataType::F64, ReduceOp::Avg) => 1e-12,
        _ => 0.0,
    }
}

/// Checks the reduced elements `from..from + count` in `got`.
fn check_reduced(got: &[u8], d: DataType, op: ReduceOp, n: usize, from: usize, what: &str) {
    let es = d.size_bytes();
    for (k, e) in got.chunks_exact(es).enumerate() {
        let (g, w) = (decode(d, e), expected(d, op, n, from + k));
        assert!(
            (g - w).abs() <= tolerance(d, op),
            "{what} {d} {op}: element {} is {g}, expected {w}",
            from + k
        );
    }
}

/// Every valid (dtype, op) pair.
fn pairs(n: usize) -> Vec<(DataType, ReduceOp)> {
    let mut v = Vec::new();
    for d in DataType::ALL {
        for op in ReduceOp::ALL {
            if Reducer::new(d, op, n).is_ok() {
                v.push((d, op));
            }
        }
    }
    v
}

/// (dtype, op) pairs, elements: every pair at sizes 0, 1 and 7, a few pairs at a size whose
/// segments per rank span several chunks.
fn reduction_cases(n: usize) -> Vec<(DataType, ReduceOp, usize)> {
    let mut v = Vec::new();
    for (d, op) in pairs(n) {
        for count in [0, 1, 7] {
            v.push((d, op, count));
        }
    }
    for (d, op) in [
        (DataType::F32, ReduceOp::Sum),
        (DataType::I32, ReduceOp::Avg),
        (DataType::BF16, ReduceOp::PremulSum { factor: 2.0 }),
    ] {
        v.push((d, op, 3 * n * CHUNK / d.size_bytes() + 3));
    }
    // Halving-doubling's last segments of two chunks and of two chunks and an element:
    // partners whose segments have different numbers of pieces.
    let p = 1 << n.ilog2();
    v.push((DataType::F32, ReduceOp::Sum, p * 2 * CHUNK / 4 + 1));
    v
}

fn algos(c: Collective) -> Vec<&'static str> {
    let v = ctran::algos::names(c);
    assert!(!v.is_empty());
    v
}

/// Where each block starts when blocks of `sizes` lie one after the other.
fn offsets(sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .scan(0, |a, &s| {
            let o = *a;
            *a += s;
            Some(o)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------

#[test]
fn all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank_over_tcp() {
    all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank(Transport::Tcp);
}

#[test]
fn all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank_over_shm() {
    all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank(Transport::Shm);
}

#[test]
fn all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank_over_ib() {
    all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank(Transport::Ib);
}

/// all_reduce: every algorithm, every (dtype, op) pair at sizes 0, 1, 7 and a few large; exact
/// results, bitwise the same on every rank.
fn all_reduce_every_algorithm_is_exact_and_bitwise_identical_on_every_rank(t: Transport) {
    for &n in t.ranks() {
        let results = with_ranks_over(t, &[Collective::AllReduce], n, "ar", |c| {
            let me = c.rank();
            let mut out = Vec::new();
            for algo in algos(Collective::AllReduce) {
                for (d, op, count) in reduction_cases(n) {
                    let mut buf = inputs(d, op, me, 0, count);
                    let buf_span = span_of(&mut buf);
                    run(
                        c,
                        Op::AllReduce {
                            buf: buf_span,
                            dtype: d,
                            op,
                        },
                        algo,
                    );
                    check_reduced(&buf, d, op, n, 0, &format!("all_reduce {algo} n={n}"));
                    out.push(buf);
                }
                // Rounding-sensitive values: every rank must still end with the same bytes.
                let count = 2 * n * CHUNK / 4 + 5;
                let mut f = Vec::with_capacity(count * 4);
                for i in 0..count {
                    let x = ((me * 7919 + i * 31) % 1000) as f32 * 0.1 - 50.0;
                    f.extend(x.to_le_bytes());
                }
                let fs = span_of(&mut f);
                run(
                    c,
                    Op::AllReduce {
                        buf: fs,
                        dtype: DataType::F32,
                        op: ReduceOp::Avg,
                    },
                    algo,
                );
                out.push(f);
            }
            out
        });
        for (r, res) in results.iter().enumerate().skip(1) {
            assert!(
                res == &results[0],
                "all_reduce results of rank {r} differ from rank 0's for n={n}"
            );
        }
    }
}

#[test]
fn reduce_every_algorithm_root_and_pair_over_tcp() {
    reduce_every_algorithm_root_and_pair(Transport::Tcp);
}

#[test]
fn reduce_every_algorithm_root_and_pair_over_shm() {
    reduce_every_algorithm_root_and_pair(Transport::Shm);
}

#[test]
fn reduce_every_algorithm_root_and_pair_over_ib() {
    reduce_every_algorithm_root_and_pair(Transport::Ib);
}

/// reduce: every algorithm, three roots, every (dtype, op) pair; non-roots' buffers untouched.
fn reduce_every_algorithm_root_and_pair(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(t, &[Collective::Reduce], n, "red", |c| {
            let me = c.rank();
            for algo in algos(Collective::Reduce) {
                for root in roots(n) {
                    for (d, op, count) in reduction_cases(n) {
                        let mut buf = inputs(d, op, me, 0, count);
                        let orig = buf.clone();
                        let s = span_of(&mut buf);
                        run(
                            c,
                            Op::Reduce {
                                buf: s,
                                dtype: d,
                                op,
                                root,
                            },
                            algo,
                        );
                        if me == root {
                            check_reduced(&buf, d, op, n, 0, &format!("reduce {algo} n={n}"));
                        } else {
                            assert_eq!(buf, orig, "reduce {algo}: non-root buffer changed");
                        }
                    }
                }
            }
        });
    }
}

fn roots(n: usize) -> Vec<usize> {
    let mut r = vec![0, n - 1, n / 2];
    r.dedup();
    r
}

#[test]
fn reduce_scatter_every_algorithm_equal_uneven_and_in_place_over_tcp() {
    reduce_scatter_every_algorithm_equal_uneven_and_in_place(Transport::Tcp);
}

#[test]
fn reduce_scatter_every_algorithm_equal_uneven_and_in_place_over_shm() {
    reduce_scatter_every_algorithm_equal_uneven_and_in_place(Transport::Shm);
}

#[test]
fn reduce_scatter_every_algorithm_equal_uneven_and_in_place_over_ib() {
    reduce_scatter_every_algorithm_equal_uneven_and_in_place(Transport::Ib);
}

/// reduce_scatter: every algorithm, equal blocks in place and uneven blocks (reduce_scatter_v).
fn reduce_scatter_every_algorithm_equal_uneven_and_in_place(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(t, &[Collective::ReduceScatter], n, "rs", |c| {
            let me = c.rank();
            for algo in algos(Collective::ReduceScatter) {
                for (d, op, count) in reduction_cases(n) {
                    // Large cases: spread the large count over the blocks.
                    let block = if count > 7 { count / n + 1 } else { count };
                    let es = d.size_bytes();
                    // Equal blocks in one tensor, the output aliasing this rank's block.
                    let mut input = inputs(d, op, me, 0, n * block);
                    let whole = span_of(&mut input);
                    let ins: Vec<Span> = (0..n)
                        .map(|j| whole.sub(j * block * es, block * es))
                        .collect();
                    run(
                        c,
                        Op::ReduceScatter {
                            inputs: ins.clone(),
                            output: ins[me],
                            dtype: d,
                            op,
                        },
                        algo,
                    );
                    let got = &input[me * block * es..(me + 1) * block * es];
                    check_reduced(
                        got,
                        d,
                        op,
                        n,
                        me * block,
                        &format!("reduce_scatter {algo} n={n} in place"),
                    );
                }
                // reduce_scatter_v: blocks of different sizes (some empty), separate buffers.
                for (d, op) in [
                    (DataType::I64, ReduceOp::Sum),
                    (DataType::F16, ReduceOp::Max),
                ] {
                    let sizes: Vec<usize> = (0..n)
                        .map(|j| {
                            (j * 5 + 3) % 9
                                + if j % 3 == 0 {
                                    0
                                } else {
                                    2 * CHUNK / d.size_bytes() / (j + 1)
                                }
                        })
                        .collect();
                    let starts = offsets(&sizes);
                    let mut blocks: Vec<Vec<u8>> = (0..n)
                        .map(|j| inputs(d, op, me, starts[j], sizes[j]))
                        .collect();
                    let ins: Vec<Span> = blocks.iter_mut().map(|b| span_of(b)).collect();
                    let mut out = vec![0u8; sizes[me] * d.size_bytes()];
                    let o = span_of(&mut out);
                    run(
                        c,
                        Op::ReduceScatter {
                            inputs: ins,
                            output: o,
                            dtype: d,
                            op,
                        },
                        algo,
                    );
                    check_reduced(
                        &out,
                        d,
                        op,
                        n,
                        starts[me],
                        &format!("reduce_scatter_v {algo} n={n}"),
                    );
                }
            }
        });
    }
}

/// Block `j`'s bytes: rank `j`'s data.
fn block_bytes(j: usize, len: usize, salt: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((j * 131 + i * 7 + salt) % 251) as u8)
        .collect()
}

#[test]
fn all_gather_every_algorithm_equal_uneven_and_split_buffers_over_tcp() {
    all_gather_every_algorithm_equal_uneven_and_split_buffers(Transport::Tcp);
}

#[test]
fn all_gather_every_algorithm_equal_uneven_and_split_buffers_over_shm() {
    all_gather_every_algorithm_equal_uneven_and_split_buffers(Transport::Shm);
}

#[test]
fn all_gather_every_algorithm_equal_uneven_and_split_buffers_over_ib() {
    all_gather_every_algorithm_equal_uneven_and_split_buffers(Transport::Ib);
}

/// all_gather: every algorithm, equal blocks into one tensor and uneven ones into separate buffers.
fn all_gather_every_algorithm_equal_uneven_and_split_buffers(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(t, &[Collective::AllGather], n, "ag", |c| {
            let me = c.rank();
            for algo in algos(Collective::AllGather) {
                for b in [0, 1, 7, 3 * CHUNK + 5] {
                    // One output tensor (all_gather_single), input separate.
                    let mut input = block_bytes(me, b, 1);
                    let mut out = vec![0u8; n * b];
                    let o = span_of(&mut out);
                    let outs = (0..n).map(|j| o.sub(j * b, b)).collect();
                    run(
                        c,
                        Op::AllGather {
                            input: span_of(&mut input),
                            outputs: outs,
                        },
                        algo,
                    );
                    for j in 0..n {
                        assert_eq!(
                            &out[j * b..(j + 1) * b],
                            &block_bytes(j, b, 1)[..],
                            "all_gather {algo} n={n} b={b} block {j}"
                        );
                    }
                }
                // all_gather_v into separate buffers, sizes differ (some empty).
                let sizes: Vec<usize> = (0..n)
                    .map(|j| {
                        if j % 4 == 1 {
                            0
                        } else {
                            (j * 977) % (2 * CHUNK) + 1
                        }
                    })
                    .collect();
                let mut input = block_bytes(me, sizes[me], 2);
                let mut outs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0u8; s]).collect();
                let spans = outs.iter_mut().map(|v| span_of(v)).collect();
                run(
                    c,
                    Op::AllGather {
                        input: span_of(&mut input),
                        outputs: spans,
                    },
                    algo,
                );
                for (j, o) in outs.iter().enumerate() {
                    assert_eq!(
                        o,
                        &block_bytes(j, sizes[j], 2),
                        "all_gather_v {algo} n={n} block {j}"
                    );
                }
            }
        });
    }
}

#[test]
fn broadcast_every_algorithm_and_root_over_tcp() {
    broadcast_every_algorithm_and_root(Transport::Tcp);
}

#[test]
fn broadcast_every_algorithm_and_root_over_shm() {
    broadcast_every_algorithm_and_root(Transport::Shm);
}

#[test]
fn broadcast_every_algorithm_and_root_over_ib() {
    broadcast_every_algorithm_and_root(Transport::Ib);
}

/// broadcast: every algorithm, three roots, sizes 0, 1, 7 and several chunks.
fn broadcast_every_algorithm_and_root(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(t, &[Collective::Broadcast], n, "bc", |c| {
            let me = c.rank();
            for algo in algos(Collective::Broadcast) {
                for root in roots(n) {
                    for len in [0, 1, 7, 5 * CHUNK + 3] {
                        let mut buf = if me == root {
                            block_bytes(root, len, 3)
                        } else {
                            vec![0u8; len]
                        };
                        run(
                            c,
                            Op::Broadcast {
                                buf: span_of(&mut buf),
                                root,
                            },
                            algo,
                        );
                        assert_eq!(
                            buf,
                            block_bytes(root, len, 3),
                            "broadcast {algo} n={n} root={root} len={len}"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn all_to_all_every_algorithm_equal_and_uneven_over_tcp() {
    all_to_all_every_algorithm_equal_and_uneven(Transport::Tcp);
}

#[test]
fn all_to_all_every_algorithm_equal_and_uneven_over_shm() {
    all_to_all_every_algorithm_equal_and_uneven(Transport::Shm);
}

#[test]
fn all_to_all_every_algorithm_equal_and_uneven_over_ib() {
    all_to_all_every_algorithm_equal_and_uneven(Transport::Ib);
}

/// all_to_all: every algorithm, equal blocks (all_to_all_single) and uneven ones (all_to_all_v).
fn all_to_all_every_algorithm_equal_and_uneven(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(t, &[Collective::AllToAll], n, "a2a", |c| {
            let me = c.rank();
            let payload = |from: usize, to: usize, len: usize| block_bytes(from * 17 + to, len, 4);
            for algo in algos(Collective::AllToAll) {
                // Equal blocks in one tensor each way (all_to_all_single); bruck only while all
                // blocks fit a chunk.
                for b in [0, 1, 7, CHUNK / 16, 2 * CHUNK + 1] {
                    if algo == "bruck" && n * b > CHUNK {
                        continue;
                    }
                    let mut input: Vec<u8> = (0..n).flat_map(|j| payload(me, j, b)).collect();
                    let mut out = vec![0u8; n * b];
                    let (i, o) = (span_of(&mut input), span_of(&mut out));
                    run_uniform(
                        c,
                        Op::AllToAll {
                            inputs: (0..n).map(|j| i.sub(j * b, b)).collect(),
                            outputs: (0..n).map(|j| o.sub(j * b, b)).collect(),
                        },
                        algo,
                    );
                    for j in 0..n {
                        assert_eq!(
                            &out[j * b..(j + 1) * b],
                            &payload(j, me, b)[..],
                            "all_to_all {algo} n={n} b={b} from {j}"
                        );
                    }
                }
                if algo == "bruck" {
                    continue;
                }
                // all_to_all_v: the block from i to j has its own size.
                let size =
                    |from: usize, to: usize| (from * 7 + to * 13) % 11 * ((from + to) % 3) * 97;
                let mut ins: Vec<Vec<u8>> = (0..n).map(|j| payload(me, j, size(me, j))).collect();
                let mut outs: Vec<Vec<u8>> = (0..n).map(|j| vec![0u8; size(j, me)]).collect();
                let (is, os) = (
                    ins.iter_mut().map(|v| span_of(v)).collect(),
                    outs.iter_mut().map(|v| span_of(v)).collect(),
                );
                run(
                    c,
                    Op::AllToAll {
                        inputs: is,
                        outputs: os,
                    },
                    algo,
                );
                for (j, o) in outs.iter().enumerate() {
                    assert_eq!(
                        o,
                        &payload(j, me, size(j, me)),
                        "all_to_all_v {algo} n={n} from {j}"
                    );
                }
            }
        });
    }
}

#[test]
fn scatter_and_gather_every_algorithm_and_root_over_tcp() {
    scatter_and_gather_every_algorithm_and_root(Transport::Tcp);
}

#[test]
fn scatter_and_gather_every_algorithm_and_root_over_shm() {
    scatter_and_gather_every_algorithm_and_root(Transport::Shm);
}

#[test]
fn scatter_and_gather_every_algorithm_and_root_over_ib() {
    scatter_and_gather_every_algorithm_and_root(Transport::Ib);
}

/// scatter and gather: every algorithm, three roots, sizes up to several chunks.
fn scatter_and_gather_every_algorithm_and_root(t: Transport) {
    for &n in t.ranks() {
        with_ranks_over(
            t,
            &[Collective::Scatter, Collective::Gather],
            n,
            "sg",
            |c| {
                let me = c.rank();
                for root in roots(n) {
                    for (coll, algo) in algos(Collective::Scatter)
                        .into_iter()
                        .map(|a| (Collective::Scatter, a))
                        .chain(
                            algos(Collective::Gather)
                                .into_iter()
                                .map(|a| (Collective::Gather, a)),
                        )
                    {
                        for b in [0, 1, 7, CHUNK / 16 - 1, 3 * CHUNK] {
                            if algo == "tree" && n * b > CHUNK {
                                continue;
                            }
                            let mut all: Vec<u8> =
                                (0..n).flat_map(|j| block_bytes(j, b, 5)).collect();
                            let whole = span_of(&mut all);
                            let blocks: Vec<Span> = (0..n).map(|j| whole.sub(j * b, b)).collect();
                            if coll == Collective::Scatter {
                                let mut out = vec![0u8; b];
                                let ins = if me == root { blocks } else { Vec::new() };
                                run(
                                    c,
                                    Op::Scatter {
                                        inputs: ins,
                                        output: span_of(&mut out),
                                        root,
                                    },
                                    algo,
                                );
                                assert_eq!(
                                    out,
                                    block_bytes(me, b, 5),
                                    "scatter {algo} n={n} root={root} b={b}"
                                );
                            } else {
                                let mut input = block_bytes(me, b, 6);
                                let mut outs = vec![0u8; n * b];
                                let o = span_of(&mut outs);
                                let spans = if me == root {
                                    (0..n).map(|j| o.sub(j * b, b)).collect()
                                } else {
                                    Vec::new()
                                };
                                run(
                                    c,
                                    Op::Gather {
                                        input: span_of(&mut input),
                                        outputs: spans,
                                        root,
                                    },
                                    algo,
                                );
                                if me == root {
                                    for j in 0..n {
                                        assert_eq!(
                                            &outs[j * b..(j + 1) * b],
                                            &block_bytes(j, b, 6)[..],
                                            "gather {algo} n={n} root={root} b={b} block {j}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                run(c, Op::Barrier, "dissemination");
            },
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Selection.

fn f32_all_reduce(buf: &mut [u8]) -> Op {
    Op::AllReduce {
        buf: span_of(buf),
        dtype: DataType::F32,
        op: ReduceOp::Sum,
    }
}

#[test]
fn explicit_choice_by_configuration_and_hint() {
    let picked = with_ranks(
        3,
        "cfg",
        |cfg| {
            cfg.algos.set(
                Collective::AllReduce,
                Choice::parse(Collective::AllReduce, "tree", "test").unwrap(),
            );
            cfg.algos.set(
                Collective::AllToAll,
                Choice::parse(Collective::AllToAll, "bruck", "test").unwrap(),
            );
        },
        |c| {
            let mut buf = vec![0u8; 64];
            let op = f32_all_reduce(&mut buf);
            let by_config = c.algo_for(&op, None).unwrap();
            let by_hint = c.algo_for(&op, Some("halving_doubling")).unwrap();
            let auto = c.algo_for(&op, Some("auto")).unwrap();
            c.run(op, None).unwrap();
            // The configured bruck cannot run uneven blocks: a clear error, and the
            // communicator stays usable.
            let mut a = vec![0u8; 3];
            let mut b = vec![0u8; 3];
            let (sa, sb) = (span_of(&mut a), span_of(&mut b));
            let uneven = Op::AllToAll {
                inputs: vec![sa.sub(0, 1), sa.sub(1, 2), Span::EMPTY],
                outputs: vec![sb.sub(0, 1), sb.sub(1, 2), Span::EMPTY],
            };
            let err = c.run(uneven, None).unwrap_err();
            assert!(err.is_invalid_argument(), "{err}");
            let msg = err.to_string();
            assert!(msg.contains("CTRAN_ALLTOALL_ALGO"), "{msg}");
            assert!(msg.contains("one of auto, pairwise, direct"), "{msg}");
            assert!(msg.contains("equal blocks"), "{msg}");
            // Equal blocks on this rank prove nothing about the others' (all_to_all cannot
            // see them): undeclared, bruck is refused on every rank alike, never run by some.
            let even = Op::AllToAll {
                inputs: vec![sa.sub(0, 1), sa.sub(1, 1), sa.sub(2, 1)],
                outputs: vec![sb.sub(0, 1), sb.sub(1, 1), sb.sub(2, 1)],
            };
            let err = c.run(even, None).unwrap_err();
            assert!(err.is_invalid_argument(), "{err}");
            assert!(err.to_string().contains("declared by the caller"), "{err}");
            c.run(Op::Barrier, None).unwrap();
            (by_config, by_hint, auto)
        },
    );
    for (by_config, by_hint, auto) in picked {
        assert_eq!(by_config, Some("tree"));
        assert_eq!(by_hint, Some("halving_doubling"));
        assert!(auto.is_some_and(|a| ctran::algos::names(Collective::AllReduce).contains(&a)));
    }
}

#[test]
fn configuration_is_read_from_the_environment_and_checked() {
    let _env = ENV.lock().unwrap_or_else(|p| p.into_inner());
    let set = |k: &str, v: Option<&str>| match v {
        // SAFETY (edition 2021: safe fns): ENV serialises every environment access of this
        // binary.
        Some(v) => std::env::set_var(k, v),
        None => std::env::remove_var(k),
    };
    set("CTRAN_ALLGATHER_ALGO", Some("Bruck"));
    set("CTRAN_COST_ALPHA_US", Some("12.5"));
    let cfg = AlgoConfig::from_env();
    set("CTRAN_BROADCAST_ALGO", Some("ring"));
    let bad = AlgoConfig::from_env();
    set("CTRAN_BROADCAST_ALGO", None);
    set("CTRAN_COST_ALPHA_US", Some("-1"));
    let bad_cost = AlgoConfig::from_env();
    set("CTRAN_ALLGATHER_ALGO", None);
    set("CTRAN_COST_ALPHA_US", None);

    let cfg = cfg.unwrap();
    assert_eq!(
        cfg.choice(Collective::AllGather),
        Choice::parse(Collective::AllGather, "bruck", "x").unwrap()
    );
    assert_eq!(cfg.choice(Collective::AllReduce), Choice::Auto);
    assert_eq!(cfg.cost.alpha_us, Some(12.5));
    let msg = bad.unwrap_err().to_string();
    assert!(
        msg.contains("CTRAN_BROADCAST_ALGO") && msg.contains("auto, tree, chain, direct"),
        "{msg}"
    );
    assert!(bad_cost.unwrap_err().is_invalid_argument());
}

#[test]
fn unknown_or_inapplicable_hints_are_errors_that_list_the_valid_names() {
    with_ranks(
        4,
        "hint",
        |_| {},
        |c| {
            let mut buf = vec![0u8; 16];
            let err = c
                .submit_with_algo(f32_all_reduce(&mut buf), None, Vec::new(), Some("bogus"))
                .wait_timeout(Duration::from_secs(10), c.rank())
                .unwrap_err();
            assert!(err.is_invalid_argument());
            let msg = err.to_string();
            assert!(
                msg.contains("auto, ring, halving_doubling, direct, tree"),
                "{msg}"
            );
            assert!(msg.contains("bogus") && msg.contains("all_reduce"), "{msg}");

            // Tree scatter holds all blocks in one staging chunk: too large is refused.
            let b = CHUNK;
            let mut out = vec![0u8; b];
            let mut all = vec![0u8; 4 * b];
            let whole = span_of(&mut all);
            let ins = if c.rank() == 0 {
                (0..4).map(|j| whole.sub(j * b, b)).collect()
            } else {
                Vec::new()
            };
            let op = Op::Scatter {
                inputs: ins,
                output: span_of(&mut out),
                root: 0,
            };
            let err = c.algo_for(&op, Some("tree")).unwrap_err();
            let msg = err.to_string();
            assert!(
                err.is_invalid_argument() && msg.contains("one of auto, direct"),
                "{msg}"
            );
            // The algorithm of another collective is unknown here.
            let err = c.algo_for(&op, Some("ring")).unwrap_err();
            assert!(err.to_string().contains("auto, tree, direct"), "{err}");
            // Nothing was queued: the communicator still works, and hints on p2p are ignored.
            c.run(Op::Barrier, None).unwrap();
            assert_eq!(
                c.algo_for(&Op::Barrier, Some("dissemination")).unwrap(),
                Some("dissemination")
            );
        },
    );
}

#[test]
fn auto_agrees_on_every_rank() {
    // Shapes only: the selector reads sizes, so all ranks may describe the same memory.
    let mut backing = vec![0u8; 1 << 26];
    let whole = span_of(&mut backing);
    for n in [2, 5, 8] {
        let picks = with_ranks(
            n,
            "auto",
            |_| {},
            |c| {
                let model = c.cost_model().expect("calibrated at init");
                assert!(model.measured, "n={n}: the model was measured");
                assert!(model.alpha > 0.0 && model.beta > 0.0 && model.gamma > 0.0);
                let mut seen = Vec::new();
                for k in (0..=26).step_by(2) {
                    let bytes = 1usize << k;
                    let big = whole.sub(0, bytes);
                    let blocks = |total: usize| {
                        (0..n)
                            .map(|j| big.sub(j * (total / n), total / n))
                            .collect::<Vec<_>>()
                    };
                    let ops = [
                        Op::AllReduce {
                            buf: big,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                        },
                        Op::Broadcast { buf: big, root: 0 },
                        Op::Reduce {
                            buf: big,
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                            root: 0,
                        },
                        Op::AllGather {
                            input: blocks(bytes)[0],
                            outputs: blocks(bytes),
                        },
                        Op::ReduceScatter {
                            inputs: blocks(bytes),
                            output: blocks(bytes)[0],
                            dtype: DataType::F32,
                            op: ReduceOp::Sum,
                        },
                        Op::AllToAll {
                            inputs: blocks(bytes),
                            outputs: blocks(bytes),
                        },
                        Op::Scatter {
                            inputs: blocks(bytes),
                            output: blocks(bytes)[0],
                            root: 0,
                        },
                        Op::Gather {
                            input: blocks(bytes)[0],
                            outputs: blocks(bytes),
                            root: 0,
                        },
                    ];
                    for op in &ops {
                        seen.push(c.algo_for(op, None).unwrap());
                    }
                }
                // all_to_all: bruck needs equal blocks on every rank, which only the caller
                // can promise; without the promise auto never picks it.
                let uniform = Hints {
                    algo: None,
                    uniform: true,
                };
                for k in 0..=12 {
                    let b = 1usize << k;
                    let blocks: Vec<Span> = (0..n).map(|j| whole.sub(j * b, b)).collect();
                    let op = Op::AllToAll {
                        inputs: blocks.clone(),
                        outputs: blocks.clone(),
                    };
                    assert_ne!(c.algo_for(&op, None).unwrap(), Some("bruck"));
                    seen.push(c.algo_for(&op, uniform).unwrap());
                    let mut uneven = blocks;
                    uneven[0] = whole.sub(0, b + 1);
                    let op = Op::AllToAll {
                        inputs: uneven.clone(),
                        outputs: uneven,
                    };
                    assert_ne!(c.algo_for(&op, uniform).unwrap(), Some("bruck"));
                }
                let m = c.cost_model().unwrap();
                let bits = [m.alpha, m.mu, m.beta, m.gamma].map(f64::to_bits);
                (seen, bits)
            },
        );
        for (r, p) in picks.iter().enumerate() {
            assert_eq!(p, &picks[0], "n={n}: rank {r} disagrees with rank 0");
        }
    }
}

/// Ranks bound to one CPU each (as `mpirun --bind-to core` places them) count their host's
/// cores as the union of their CPU sets, not the one CPU each sees.
#[test]
fn ranks_bound_to_one_cpu_each_count_the_hosts_cores() {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    use nix::unistd::Pid;
    let mine = sched_getaffinity(Pid::from_raw(0)).unwrap();
    let allowed: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| mine.is_set(c).unwrap())
        .collect();
    let n = 2;
    let cores = with_ranks(
        n,
        "bound",
        |cfg| {
            // The rank's thread, before init: the progress thread inherits the mask.
            let mut one = CpuSet::new();
            one.set(allowed[cfg.rank % allowed.len()]).unwrap();
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
        },
        |c| c.cost_model().expect("calibrated at init").cores_per_host,
    );
    let expected = n.min(allowed.len());
    assert!(
        cores.iter().all(|&k| k == expected),
        "cores per host {cores:?}, expected {expected} ({} CPUs allowed)",
        allowed.len()
    );
}

/// Ranks of one host that talk over TCP agree on the sender's share of a byte on loopback;
/// over shared memory the model counts a rank's bytes as the larger of sent and received.
#[test]
fn ranks_over_loopback_tcp_agree_on_the_senders_share() {
    let share = |c: &Comm| c.cost_model().expect("calibrated at init").send_share;
    let over_tcp = with_ranks(3, "share-tcp", |_| {}, share);
    assert!(
        over_tcp
            .iter()
            .all(|&s| s == Some(ctran::algos::select::cost::LOOPBACK_SEND_SHARE)),
        "over TCP: {over_tcp:?}"
    );
    let over_shm = with_ranks(3, "share-shm", |cfg| cfg.use_shm = true, share);
    assert!(
        over_shm.iter().all(|s| s.is_none()),
        "over shared memory: {over_shm:?}"
    );
}

/// Blocks far larger than what the transport buffers between two ranks (shared-memory FIFOs of
/// two chunk-sized slots, while ring algorithms keep up to eight staging slots in flight): a
/// pipelined algorithm that made a rank wait for a send to finish before posting a receive its
/// left neighbour's send needs (ring reduce_scatter once sent a whole block of step 0 before
/// any piece of step 1, and each rank waited for its right neighbour to free a slot) deadlocks
/// here, and the short timeout turns the hang into a failure.
#[test]
fn large_blocks_over_a_shallow_fifo_do_not_deadlock() {
    const PIECES: usize = 24;
    for n in [2, 3, 4] {
        with_ranks(
            n,
            "deep",
            |cfg| {
                cfg.use_shm = true;
                cfg.shm.fifo_slots = 2;
                cfg.shm.fifo_slot_bytes = CHUNK;
                cfg.timeout = Duration::from_secs(10);
            },
            |c| {
                let me = c.rank();
                let (d, op) = (DataType::F32, ReduceOp::Sum);
                let es = d.size_bytes();
                let mut ran = 0;
                for algo in algos(Collective::ReduceScatter) {
                    // Equal blocks, then uneven ones (reduce_scatter_v), all of many pieces.
                    let even = vec![PIECES * CHUNK / es; n];
                    let uneven: Vec<usize> = (0..n)
                        .map(|j| (j + 1) * PIECES * CHUNK / es / n + 3 * j)
                        .collect();
                    for sizes in [even, uneven] {
                        let starts = offsets(&sizes);
                        let mut blocks: Vec<Vec<u8>> = (0..n)
                            .map(|j| inputs(d, op, me, starts[j], sizes[j]))
                            .collect();
                        let ins: Vec<Span> = blocks.iter_mut().map(|b| span_of(b)).collect();
                        let mut out = vec![0u8; sizes[me] * es];
                        let o = span_of(&mut out);
                        run(
                            c,
                            Op::ReduceScatter {
                                inputs: ins,
                                output: o,
                                dtype: d,
                                op,
                            },
                            algo,
                        );
                        let what = format!("reduce_scatter {algo} n={n} sizes={sizes:?}");
                        check_reduced(&out, d, op, n, starts[me], &what);
                        ran += 1;
                    }
                }
                let count = n * PIECES * CHUNK / es;
                for algo in algos(Collective::AllReduce) {
                    let mut buf = inputs(d, op, me, 0, count);
                    let b = span_of(&mut buf);
                    run(
                        c,
                        Op::AllReduce {
                            buf: b,
                            dtype: d,
                            op,
                        },
                        algo,
                    );
                    check_reduced(&buf, d, op, n, 0, &format!("all_reduce {algo} n={n}"));
                    ran += 1;
                }
                for algo in algos(Collective::AllGather) {
                    let len = PIECES * CHUNK;
                    let mut input = block_bytes(me, len, 1);
                    let mut output = vec![0u8; n * len];
                    let out = span_of(&mut output);
                    run(
                        c,
                        Op::AllGather {
                            input: span_of(&mut input),
                            outputs: (0..n).map(|j| out.sub(j * len, len)).collect(),
                        },
                        algo,
                    );
                    for j in 0..n {
                        assert_eq!(
                            output[j * len..(j + 1) * len],
                            block_bytes(j, len, 1),
                            "all_gather {algo} n={n} block {j}"
                        );
                    }
                    ran += 1;
                }
                assert!(ran >= 3, "ran {ran} operations");
            },
        );
    }
}
