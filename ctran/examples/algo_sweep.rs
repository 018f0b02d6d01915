//! Times every algorithm of one collective and `auto` side by side, to tune the cost model.
//!
//! Ranks are threads of this process over TCP on loopback (shared memory off). At each size the
//! algorithms run interleaved, `--reps` times each, and the median time per algorithm is kept,
//! so a burst of load from elsewhere hits all of them alike. Prints one row per size: the time
//! of each algorithm (the slowest rank's, in microseconds), auto's pick, the best algorithm and
//! auto's time over the best one's.
//!
//! ```text
//! cargo run --release -p ctran --example algo_sweep -- --n 4 --coll all_reduce
//! cargo run --release -p ctran --example algo_sweep -- --n 8 --coll all_gather --min 8 --max 1M --reps 7
//! ```
//! Sizes follow torchcomms-perf: the whole buffer (all_reduce, broadcast, reduce, all_to_all),
//! the gathered output (all_gather, gather) or the whole input (reduce_scatter, scatter), f32.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctran::algos::select::cost::profile;
use ctran::algos::select::{Collective, Hints, Shape};
use ctran::bootstrap::HashStore;
use ctran::{Comm, CommConfig, DataType, Op, ReduceOp, Span};

struct Args {
    n: usize,
    coll: Collective,
    min: usize,
    max: usize,
    reps: usize,
    /// Target time of one timed batch.
    batch: Duration,
}

fn parse_bytes(s: &str) -> usize {
    let (num, mult) = match s.chars().last() {
        Some('K') | Some('k') => (&s[..s.len() - 1], 1 << 10),
        Some('M') | Some('m') => (&s[..s.len() - 1], 1 << 20),
        Some('G') | Some('g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().expect("a byte count") * mult
}

fn args() -> Args {
    let mut a = Args {
        n: 4,
        coll: Collective::AllReduce,
        min: 8,
        max: 64 << 20,
        reps: 5,
        batch: Duration::from_millis(30),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for w in argv.chunks(2) {
        let v = w.get(1).map(String::as_str).unwrap_or_default();
        match w[0].as_str() {
            "--n" => a.n = v.parse().expect("--n N"),
            "--coll" => a.coll = Collective::from_name(v).expect("--coll all_reduce|..."),
            "--min" => a.min = parse_bytes(v),
            "--max" => a.max = parse_bytes(v),
            "--reps" => a.reps = v.parse().expect("--reps N"),
            "--batch-ms" => a.batch = Duration::from_millis(v.parse().expect("--batch-ms MS")),
            other => panic!("unknown option {other}"),
        }
    }
    a
}

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: the vectors outlive every operation given these spans (each is waited for).
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Buffers of one collective at one size.
struct Bufs {
    a: Vec<f32>,
    b: Vec<f32>,
}

fn op_for(c: Collective, bytes: usize, n: usize, rank: usize, bufs: &mut Bufs) -> Op {
    let blk = bytes / 4 / n;
    let whole = bytes / 4;
    let blocks = |s: Span, count: usize| -> Vec<Span> {
        (0..n).map(|j| s.sub(j * count * 4, count * 4)).collect()
    };
    match c {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => {
            bufs.a.resize(whole, 1.0);
            let buf = span_of(&mut bufs.a);
            match c {
                Collective::AllReduce => Op::AllReduce {
                    buf,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                },
                Collective::Broadcast => Op::Broadcast { buf, root: 0 },
                _ => Op::Reduce {
                    buf,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                    root: 0,
                },
            }
        }
        Collective::AllGather | Collective::Gather => {
            bufs.a.resize(blk, 1.0);
            bufs.b.resize(blk * n, 0.0);
            let input = span_of(&mut bufs.a);
            let out = span_of(&mut bufs.b);
            if c == Collective::AllGather {
                Op::AllGather {
                    input,
                    outputs: blocks(out, blk),
                }
            } else {
                Op::Gather {
                    input,
                    outputs: if rank == 0 {
                        blocks(out, blk)
                    } else {
                        Vec::new()
                    },
                    root: 0,
                }
            }
        }
        Collective::ReduceScatter | Collective::Scatter => {
            bufs.a.resize(blk * n, 1.0);
            bufs.b.resize(blk, 0.0);
            let input = span_of(&mut bufs.a);
            let output = span_of(&mut bufs.b);
            if c == Collective::ReduceScatter {
                Op::ReduceScatter {
                    inputs: blocks(input, blk),
                    output,
                    dtype: DataType::F32,
                    op: ReduceOp::Sum,
                }
            } else {
                Op::Scatter {
                    inputs: if rank == 0 {
                        blocks(input, blk)
                    } else {
                        Vec::new()
                    },
                    output,
                    root: 0,
                }
            }
        }
        Collective::AllToAll => {
            bufs.a.resize(blk * n, 1.0);
            bufs.b.resize(blk * n, 0.0);
            Op::AllToAll {
                inputs: blocks(span_of(&mut bufs.a), blk),
                outputs: blocks(span_of(&mut bufs.b), blk),
            }
        }
        Collective::Barrier => Op::Barrier,
    }
}

/// The slowest rank's value.
fn max_over_ranks(c: &Comm, v: f64) -> f64 {
    let mut x = [v];
    c.run(
        Op::AllReduce {
            buf: span_of(&mut x),
            dtype: DataType::F64,
            op: ReduceOp::Max,
        },
        None,
    )
    .expect("all_reduce of a timing");
    x[0]
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank_main(c: &Comm, a: &Args) {
    let n = c.size();
    let mut names: Vec<&str> = ctran::algos::names(a.coll);
    names.push("auto");
    if c.rank() == 0 {
        let m = c.cost_model().expect("calibrated");
        println!(
            "# {} n={n}: alpha {:.1} us, mu {:.1} us, beta {:.3} GB/s, gamma {:.2} GB/s, {} ranks/host on {} cores",
            a.coll,
            m.alpha * 1e6,
            m.mu * 1e6,
            1e-9 / m.beta,
            1e-9 / m.gamma,
            m.ranks_per_host,
            m.cores_per_host
        );
        let mut h = format!("{:>10}", "bytes");
        for name in &names {
            h.push_str(&format!(" {:>12}", name));
        }
        h.push_str(&format!(
            " {:>18} {:>18} {:>7}",
            "auto picks", "best", "auto/best"
        ));
        println!("{h}");
    }
    let mut bytes = a.min;
    while bytes <= a.max {
        let mut bufs = Bufs {
            a: Vec::new(),
            b: Vec::new(),
        };
        let op = op_for(a.coll, bytes, n, c.rank(), &mut bufs);
        // Every rank passes equal blocks here (the `_single` collectives), and says so.
        let auto = Hints {
            algo: None,
            uniform: true,
        };
        let pick = c.algo_for(&op, auto).expect("auto resolves").unwrap_or("-");
        let usable: Vec<bool> = names
            .iter()
            .map(|&nm| nm == "auto" || c.algo_for(&op, Some(nm)).is_ok())
            .collect();
        // Iterations per batch: from one timed run, agreed by all ranks.
        let one = {
            c.run(Op::Barrier, None).expect("barrier");
            let t0 = Instant::now();
            c.submit_with_options(op.clone(), None, Vec::new(), auto, None)
                .wait_timeout(Duration::from_secs(600), c.rank())
                .expect("warm-up");
            max_over_ranks(c, t0.elapsed().as_secs_f64())
        };
        let iters = ((a.batch.as_secs_f64() / one.max(1e-6)) as usize).clamp(1, 200);
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for _ in 0..a.reps {
            for (k, &name) in names.iter().enumerate() {
                if !usable[k] {
                    continue;
                }
                let hints = Hints {
                    algo: (name != "auto").then_some(name),
                    uniform: true,
                };
                c.run(Op::Barrier, None).expect("barrier");
                let t0 = Instant::now();
                for _ in 0..iters {
                    c.submit_with_options(op.clone(), None, Vec::new(), hints, None)
                        .wait_timeout(Duration::from_secs(600), c.rank())
                        .expect("timed run");
                }
                let t = max_over_ranks(c, t0.elapsed().as_secs_f64() / iters as f64);
                times[k].push(t);
            }
        }
        if c.rank() == 0 {
            let med: Vec<Option<f64>> = times
                .iter_mut()
                .map(|t| (!t.is_empty()).then(|| median(t)))
                .collect();
            let (best_k, best) = med[..names.len() - 1]
                .iter()
                .enumerate()
                .filter_map(|(k, t)| t.map(|t| (k, t)))
                .min_by(|x, y| x.1.total_cmp(&y.1))
                .expect("some algorithm runs");
            let auto = med[names.len() - 1].expect("auto runs");
            let picked = names.iter().position(|&nm| nm == pick).and_then(|k| med[k]);
            let mut row = format!("{bytes:>10}");
            for t in &med {
                row.push_str(&match t {
                    Some(t) => format!(" {:>12.1}", t * 1e6),
                    None => format!(" {:>12}", "-"),
                });
            }
            // Auto's pick judged on the picked algorithm's own median as well as on the auto
            // runs, both against the best median.
            let ratio = auto / best;
            let pick_ratio = picked.map_or(f64::NAN, |p| p / best);
            row.push_str(&format!(
                " {:>18} {:>18} {:>7.2} (pick {:.2})",
                pick, names[best_k], ratio, pick_ratio
            ));
            println!("{row}");
            // The model's predictions, under the measurements.
            let model = c.cost_model().expect("calibrated");
            let shape = Shape::of(&op, n).expect("a collective");
            let mut row = format!("{:>10}", "model");
            for &name in &names {
                row.push_str(&match a.coll.algo(name) {
                    Some(algo) if c.algo_for(&op, Some(name)).is_ok() => format!(
                        " {:>12.1}",
                        model.cost(algo, &shape, n, c.config().chunk_bytes) * 1e6
                    ),
                    _ => format!(" {:>12}", "-"),
                });
            }
            println!("{row}");
            if std::env::var_os("SWEEP_PROFILES").is_some() {
                for (k, &name) in names.iter().enumerate() {
                    let (Some(algo), Some(t)) = (a.coll.algo(name), med[k]) else {
                        continue;
                    };
                    let f = profile(algo, &shape, n, c.config().chunk_bytes);
                    println!(
                        "prof {} {n} {bytes} {name} {} {} {} {} {} {} {} {} {} {:.3}",
                        a.coll,
                        f.hops,
                        0.0,
                        0.0,
                        f.messages,
                        model.busiest(&f),
                        f.total,
                        f.reduced,
                        f.copied,
                        0.0,
                        t * 1e6
                    );
                }
                println!(
                    "params {} {n} {} {} {} {} {} {}",
                    a.coll,
                    model.alpha,
                    model.mu,
                    model.beta,
                    model.gamma,
                    model.ranks_per_host,
                    model.cores_per_host
                );
            }
        }
        bytes = if bytes == 0 { 1 } else { bytes * 2 };
    }
}

fn main() {
    let a = args();
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        for rank in 0..a.n {
            let store = Arc::clone(&store);
            let a = &a;
            s.spawn(move || {
                let mut cfg = CommConfig::from_env("sweep", rank, a.n).expect("config");
                cfg.use_shm = false;
                let comm = Comm::init(cfg, store).expect("init");
                rank_main(&comm, a);
                comm.finalize().expect("finalize");
            });
        }
    });
}
