//! Every collective of the engine with ranks as threads of this process, over real TCP on
//! loopback. Staging chunks are made tiny so chunking and pipelining paths run on small data.

use std::sync::Arc;
use std::time::Duration;

use ctran::bootstrap::HashStore;
use ctran::{Comm, CommConfig, DataType, Op, P2p, ReduceOp, RequestStatus, Span};

/// Runs `f` on `n` thread-ranks, once over TCP alone and once with shared memory between them.
fn with_ranks<R: Send>(n: usize, name: &str, f: impl Fn(&Comm) -> R + Sync) -> Vec<R> {
    let _tcp = with_ranks_on(n, &format!("{name}-tcp"), false, &f);
    with_ranks_on(n, &format!("{name}-shm"), true, &f)
}

fn with_ranks_on<R: Send>(
    n: usize,
    name: &str,
    shm: bool,
    f: impl Fn(&Comm) -> R + Sync,
) -> Vec<R> {
    with_ranks_finalizing(n, name, shm, f)
        .into_iter()
        .map(|(r, fin)| {
            fin.expect("finalize after a clean run");
            r
        })
        .collect()
}

/// Like `with_ranks`, but hands back each rank's finalize result instead of requiring success.
fn with_ranks_finalizing<R: Send>(
    n: usize,
    name: &str,
    shm: bool,
    f: impl Fn(&Comm) -> R + Sync,
) -> Vec<(R, ctran::Result<()>)> {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = Arc::clone(&store);
                let f = &f;
                s.spawn(move || {
                    let mut cfg = CommConfig::from_env(format!("{name}-n{n}"), rank, n).unwrap();
                    cfg.timeout = Duration::from_secs(30);
                    cfg.chunk_bytes = 4096;
                    cfg.use_shm = shm;
                    // Small shared buffers, so multi-round paths run on small data too.
                    cfg.shm.coll_bytes = 8192;
                    cfg.shm.fifo_slot_bytes = 1024;
                    let comm = Comm::init(cfg, store).unwrap();
                    let r = f(&comm);
                    (r, comm.finalize())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: every test waits for its operation before touching or dropping the vector.
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn val(rank: usize, i: usize) -> i64 {
    ((rank * 7919 + i * 31) % 1000) as i64 - 500
}

const SIZES: [usize; 4] = [0, 1, 7, 5003];
const RANKS: [usize; 5] = [1, 2, 3, 5, 8];

#[test]
fn all_reduce_sum_and_max_are_exact_and_identical() {
    for n in RANKS {
        let results = with_ranks(n, "ar", |c| {
            let mut out = Vec::new();
            for &count in &SIZES {
                for op in [ReduceOp::Sum, ReduceOp::Max] {
                    let mut v: Vec<i64> = (0..count).map(|i| val(c.rank(), i)).collect();
                    c.run(
                        Op::AllReduce {
                            buf: span_of(&mut v),
                            dtype: DataType::I64,
                            op,
                        },
                        None,
                    )
                    .unwrap();
                    let want: Vec<i64> = (0..count)
                        .map(|i| {
                            let it = (0..n).map(|r| val(r, i));
                            if op == ReduceOp::Sum {
                                it.sum()
                            } else {
                                it.max().unwrap()
                            }
                        })
                        .collect();
                    assert_eq!(v, want, "n={n} count={count} op={op}");
                }
                let mut f: Vec<f32> = (0..count)
                    .map(|i| (val(c.rank(), i) as f32) * 0.1)
                    .collect();
                c.run(
                    Op::AllReduce {
                        buf: span_of(&mut f),
                        dtype: DataType::F32,
                        op: ReduceOp::Avg,
                    },
                    None,
                )
                .unwrap();
                out.push(f.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            out
        });
        assert!(
            results.windows(2).all(|w| w[0] == w[1]),
            "float results differ across ranks for n={n}"
        );
    }
}

#[test]
fn reduce_broadcast_and_rooted_ops() {
    for n in RANKS {
        with_ranks(n, "rooted", |c| {
            let me = c.rank();
            for &count in &SIZES {
                for root in [0, n - 1, n / 2] {
                    let mut v: Vec<i64> = (0..count).map(|i| val(me, i)).collect();
                    let orig = v.clone();
                    c.run(
                        Op::Reduce {
                            buf: span_of(&mut v),
                            dtype: DataType::I64,
                            op: ReduceOp::Sum,
                            root,
                        },
                        None,
                    )
                    .unwrap();
                    if me == root {
                        let want: Vec<i64> = (0..count)
                            .map(|i| (0..n).map(|r| val(r, i)).sum())
                            .collect();
                        assert_eq!(v, want, "reduce n={n} count={count} root={root}");
                    } else {
                        assert_eq!(v, orig, "non-root buffer changed");
                    }
                    let mut b: Vec<i64> = if me == root {
                        (0..count).map(|i| val(root, i)).collect()
                    } else {
                        vec![0; count]
                    };
                    c.run(
                        Op::Broadcast {
                            buf: span_of(&mut b),
                            root,
                        },
                        None,
                    )
                    .unwrap();
                    assert_eq!(
                        b,
                        (0..count).map(|i| val(root, i)).collect::<Vec<_>>(),
                        "broadcast"
                    );

                    // scatter then gather back
                    let mut blocks: Vec<Vec<i64>> = (0..n)
                        .map(|j| (0..count).map(|i| val(j, i)).collect())
                        .collect();
                    let inputs = if me == root {
                        blocks.iter_mut().map(|b| span_of(b)).collect()
                    } else {
                        Vec::new()
                    };
                    let mut got = vec![0i64; count];
                    c.run(
                        Op::Scatter {
                            inputs,
                            output: span_of(&mut got),
                            root,
                        },
                        None,
                    )
                    .unwrap();
                    assert_eq!(
                        got,
                        (0..count).map(|i| val(me, i)).collect::<Vec<_>>(),
                        "scatter"
                    );
                    let mut gathered: Vec<Vec<i64>> = (0..n).map(|_| vec![0; count]).collect();
                    let outputs = if me == root {
                        gathered.iter_mut().map(|b| span_of(b)).collect()
                    } else {
                        Vec::new()
                    };
                    c.run(
                        Op::Gather {
                            input: span_of(&mut got),
                            outputs,
                            root,
                        },
                        None,
                    )
                    .unwrap();
                    if me == root {
                        for (j, g) in gathered.iter().enumerate() {
                            assert_eq!(
                                g,
                                &(0..count).map(|i| val(j, i)).collect::<Vec<_>>(),
                                "gather"
                            );
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn gathers_scatters_and_all_to_all_with_uneven_blocks() {
    for n in RANKS {
        with_ranks(n, "ag", |c| {
            let me = c.rank();
            for &count in &SIZES {
                // all_gather_v: rank j contributes count + j elements
                let mut input: Vec<i64> = (0..count + me).map(|i| val(me, i)).collect();
                let mut outs: Vec<Vec<i64>> = (0..n).map(|j| vec![0; count + j]).collect();
                let outputs = outs.iter_mut().map(|o| span_of(o)).collect();
                c.run(
                    Op::AllGather {
                        input: span_of(&mut input),
                        outputs,
                    },
                    None,
                )
                .unwrap();
                for (j, o) in outs.iter().enumerate() {
                    assert_eq!(
                        o,
                        &(0..count + j).map(|i| val(j, i)).collect::<Vec<_>>(),
                        "all_gather_v n={n}"
                    );
                }

                // reduce_scatter_v: block j has count + j elements
                let mut ins: Vec<Vec<i64>> = (0..n)
                    .map(|j| (0..count + j).map(|i| val(me, i + j)).collect())
                    .collect();
                let inputs = ins.iter_mut().map(|b| span_of(b)).collect();
                let mut out = vec![0i64; count + me];
                c.run(
                    Op::ReduceScatter {
                        inputs,
                        output: span_of(&mut out),
                        dtype: DataType::I64,
                        op: ReduceOp::Sum,
                    },
                    None,
                )
                .unwrap();
                let want: Vec<i64> = (0..count + me)
                    .map(|i| (0..n).map(|r| val(r, i + me)).sum())
                    .collect();
                assert_eq!(out, want, "reduce_scatter_v n={n} count={count}");

                // all_to_all_v: rank i sends (i + j) % 3 + count elements to rank j
                let len = |from: usize, to: usize| (from + to) % 3 + count;
                let mut ins: Vec<Vec<i64>> = (0..n)
                    .map(|j| (0..len(me, j)).map(|i| val(me * 100 + j, i)).collect())
                    .collect();
                let mut outs: Vec<Vec<i64>> = (0..n).map(|j| vec![0; len(j, me)]).collect();
                let inputs = ins.iter_mut().map(|b| span_of(b)).collect();
                let outputs = outs.iter_mut().map(|b| span_of(b)).collect();
                c.run(Op::AllToAll { inputs, outputs }, None).unwrap();
                for (j, o) in outs.iter().enumerate() {
                    assert_eq!(
                        o,
                        &(0..len(j, me))
                            .map(|i| val(j * 100 + me, i))
                            .collect::<Vec<_>>(),
                        "all_to_all_v"
                    );
                }
            }
            c.run(Op::Barrier, None).unwrap();
        });
    }
}

#[test]
fn async_p2p_exchange_in_both_directions_does_not_deadlock() {
    with_ranks(2, "p2p", |c| {
        let peer = 1 - c.rank();
        // 2.4 MB: larger than socket buffers and than the 1 MiB that one system call moves
        let count = 300_000;
        let mut send: Vec<i64> = (0..count).map(|i| val(c.rank(), i)).collect();
        let mut recv = vec![0i64; count];
        let s = c.submit(
            Op::Send {
                buf: span_of(&mut send),
                peer,
            },
            None,
        );
        let r = c.submit(
            Op::Recv {
                buf: span_of(&mut recv),
                peer,
            },
            None,
        );
        s.wait_timeout(Duration::from_secs(30), c.rank()).unwrap();
        r.wait_timeout(Duration::from_secs(30), c.rank()).unwrap();
        assert_eq!(recv, (0..count).map(|i| val(peer, i)).collect::<Vec<_>>());
        // batch: two sends and two receives to the same peer, matched in order
        let mut a = vec![c.rank() as i64; 10];
        let mut b = vec![c.rank() as i64 + 10; 20];
        let mut ra = vec![0i64; 10];
        let mut rb = vec![0i64; 20];
        let ops = vec![
            P2p::Send {
                buf: span_of(&mut a),
                peer,
            },
            P2p::Send {
                buf: span_of(&mut b),
                peer,
            },
            P2p::Recv {
                buf: span_of(&mut ra),
                peer,
            },
            P2p::Recv {
                buf: span_of(&mut rb),
                peer,
            },
        ];
        c.run(Op::Batch { ops }, None).unwrap();
        assert_eq!(ra, vec![peer as i64; 10]);
        assert_eq!(rb, vec![peer as i64 + 10; 20]);
    });
}

#[test]
fn split_makes_working_subcommunicators() {
    with_ranks(5, "parent", |c| {
        let me = c.rank();
        let ranks: Vec<usize> = if me % 2 == 0 {
            vec![0, 2, 4]
        } else {
            vec![3, 1]
        };
        let child = c
            .split(&ranks, "child", None, false)
            .unwrap()
            .expect("every rank joins");
        assert_eq!(child.size(), ranks.len());
        assert_eq!(child.rank(), ranks.iter().position(|&r| r == me).unwrap());
        let mut v = vec![me as i64; 3];
        child
            .run(
                Op::AllReduce {
                    buf: span_of(&mut v),
                    dtype: DataType::I64,
                    op: ReduceOp::Sum,
                },
                None,
            )
            .unwrap();
        assert_eq!(v, vec![ranks.iter().sum::<usize>() as i64; 3]);
        child.finalize().unwrap();
        let none = c
            .split(if me == 0 { &[0][..] } else { &[] }, "solo", None, false)
            .unwrap();
        assert_eq!(none.is_some(), me == 0);
    });
}

#[test]
fn size_mismatch_is_reported_not_hung() {
    // Over TCP every message carries its length; the shared-memory collectives trust the sizes
    // (as NCCL does), so this check runs on the socket path.
    let results = with_ranks_finalizing(2, "mismatch", false, |c| {
        let mut v = vec![0i64; 10 + c.rank()];
        let err = c.run(
            Op::Broadcast {
                buf: span_of(&mut v),
                root: 0,
            },
            Some(Duration::from_secs(5)),
        );
        err.map_err(|e| e.to_string())
    });
    let rank1 = results[1].0.as_ref().unwrap_err();
    assert!(rank1.contains("mismatch with peer 0"), "{rank1}");
    // Rank 0 only sends, but a broadcast waits until its receivers accepted the data: its
    // operation fails too, with rank 1's reason.
    let rank0 = results[0].0.as_ref().unwrap_err();
    assert!(
        rank0.contains("lost peer 1") && rank0.contains("expected 88 bytes, the peer sent 80"),
        "{rank0}"
    );
}

#[test]
fn an_empty_collective_completes_at_submission_but_never_before_earlier_ones() {
    with_ranks(2, "empty", |c| {
        let mut none: Vec<f32> = Vec::new();
        let empty = |none: &mut Vec<f32>| Op::AllReduce {
            buf: span_of(none),
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        // Nothing before it: done when `submit` returns, and traced as completed.
        let first = c.submit(empty(&mut none), None);
        assert_eq!(first.status(), RequestStatus::Completed);
        let dump = c.trace().snapshot();
        assert_eq!(dump.collective.completed, first.seq());
        let rec = dump
            .records
            .iter()
            .find(|r| r.seq == first.seq() && r.op == "all_reduce");
        assert_eq!(
            rec.map(|r| r.state),
            Some(colltrace::schema::State::Completed),
            "{:?}",
            dump.records
        );
        // Behind an all_reduce that rank 1 joins late: not before it.
        let mut v = vec![1i64; 8];
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let full = c.submit(
            Op::AllReduce {
                buf: span_of(&mut v),
                dtype: DataType::I64,
                op: ReduceOp::Sum,
            },
            None,
        );
        let second = c.submit(empty(&mut none), None);
        let seen = (c.rank() == 0).then(|| {
            std::thread::sleep(Duration::from_millis(100));
            (full.status(), second.status())
        });
        let waited = second.wait_timeout(Duration::from_secs(30), c.rank());
        let after = full.status();
        // Checked once `full` finished with `v`.
        full.wait_timeout(Duration::from_secs(30), c.rank())
            .unwrap();
        waited.unwrap();
        if let Some((full_then, second_then)) = seen {
            assert_eq!(full_then, RequestStatus::Started);
            assert_ne!(second_then, RequestStatus::Completed);
        }
        assert_eq!(after, RequestStatus::Completed);
        assert_eq!(v, vec![2i64; 8]);
    });
}
