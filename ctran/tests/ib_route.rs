//! Communicators routed through the ib transport by the mapper (`CTRAN_BACKENDS` with `ib`),
//! on ibverbx's software fabric: ranks are threads of this process, each a device of the one
//! fabric. Which pairs use ib, that the data really crosses the fabric, and that a peer that
//! aborts fails the ranks waiting on it over ib instead of leaving them to their timeout. The
//! algorithm matrix over ib is in `algorithms.rs` (`*_over_ib`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ctran::bootstrap::HashStore;
use ctran::transport::ib::{soft_fabric, IbProvider};
use ctran::{Comm, CommConfig, DataType, Op, ReduceOp, Span};

fn span_of<T>(v: &mut [T]) -> Span {
    // SAFETY: every test waits for its operation before touching or dropping the vector.
    unsafe { Span::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

/// Runs `f` on `n` ranks (threads) whose configuration `tweak` adjusts, over TCP with ib.
fn with_ranks<R: Send>(
    n: usize,
    name: &str,
    tweak: impl Fn(usize, &mut CommConfig) + Sync,
    f: impl Fn(Comm) -> R + Sync,
) -> Vec<R> {
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let store = Arc::clone(&store);
                let (f, tweak) = (&f, &tweak);
                s.spawn(move || {
                    let mut cfg = CommConfig::from_env(name, rank, n).unwrap();
                    cfg.timeout = Duration::from_secs(30);
                    cfg.use_shm = false;
                    cfg.want_ib = true;
                    cfg.ib_provider = IbProvider::Soft;
                    tweak(rank, &mut cfg);
                    f(Comm::init(cfg, store).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn all_reduce(c: &Comm, len: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..len).map(|i| (c.rank() * len + i) as f32).collect();
    c.run(
        Op::AllReduce {
            buf: span_of(&mut v),
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        },
        None,
    )
    .unwrap();
    v
}

fn expected(n: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (0..n).map(|r| (r * len + i) as f32).sum())
        .collect()
}

#[test]
fn every_peer_goes_through_ib_and_the_bytes_cross_the_fabric() {
    let (_, before) = soft_fabric().stats();
    let len = 1 << 16;
    let outs = with_ranks(
        3,
        "ib-route-all",
        |_, _| {},
        |c| {
            let v = all_reduce(&c, len);
            let t = c.trace().snapshot().transport;
            c.finalize().unwrap();
            (v, t)
        },
    );
    for (rank, (v, t)) in outs.into_iter().enumerate() {
        assert_eq!(v, expected(3, len), "rank {rank}");
        assert_eq!(t.as_deref(), Some("ib"), "rank {rank}");
    }
    let (_, after) = soft_fabric().stats();
    // Each rank's 256 KiB contribution crosses the fabric at least once.
    assert!(
        after - before >= 3 * 4 * len as u64,
        "the fabric moved {} bytes",
        after - before
    );
}

#[test]
fn a_rank_without_ib_talks_socket_and_the_others_keep_ib() {
    // Rank 2 asks for verbs: on a machine without an RDMA device it opens nothing; on one
    // with a device it opens another provider than its peers'. Either way its pairs use TCP.
    let outs = with_ranks(
        3,
        "ib-route-mixed",
        |rank, cfg| {
            if rank == 2 {
                cfg.ib_provider = IbProvider::Verbs;
            }
        },
        |c| {
            let v = all_reduce(&c, 1000);
            let t = c.trace().snapshot().transport;
            c.finalize().unwrap();
            (v, t)
        },
    );
    let names: Vec<_> = outs.iter().map(|(_, t)| t.as_deref()).collect();
    assert_eq!(
        names,
        [Some("ib+socket"), Some("ib+socket"), Some("socket")]
    );
    for (rank, (v, _)) in outs.into_iter().enumerate() {
        assert_eq!(v, expected(3, 1000), "rank {rank}");
    }
}

#[test]
fn a_peer_that_aborts_fails_the_receive_waiting_on_it_over_ib() {
    let outs = with_ranks(
        2,
        "ib-route-abort",
        |_, _| {},
        |c| {
            all_reduce(&c, 16);
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(200));
                c.abort("test: rank 1 gives up");
                return None;
            }
            let mut buf = vec![0u8; 1 << 20];
            let start = Instant::now();
            let r = c.run(
                Op::Recv {
                    buf: span_of(&mut buf),
                    peer: 1,
                },
                Some(Duration::from_secs(20)),
            );
            Some((r, start.elapsed()))
        },
    );
    let (r, took) = outs[0].as_ref().expect("rank 0 waited");
    let err = r.as_ref().expect_err("the receive cannot succeed");
    assert!(
        *took < Duration::from_secs(10),
        "rank 0 learned of the abort after {took:?}: {err}"
    );
    assert!(
        err.to_string().contains("rank 1 gives up") || err.to_string().contains("peer 1"),
        "{err}"
    );
}

#[test]
fn window_puts_and_signals_to_ib_peers_cross_the_fabric() {
    use ctran::window::Window;
    let len = 16 << 20;
    let (_, before) = soft_fabric().stats();
    with_ranks(
        2,
        "ib-route-window",
        |_, _| {},
        |c| {
            let comm = Arc::new(c);
            let me = comm.rank();
            let mut buf = vec![0u8; len];
            let win = Window::new(Arc::clone(&comm));
            win.register(span_of(&mut buf), Vec::new(), None).unwrap();
            let wait = |r: ctran::Request| r.wait_timeout(Duration::from_secs(30), me).unwrap();
            if me == 0 {
                let mut src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                wait(win.put(span_of(&mut src), Vec::new(), 1, 0, None));
                wait(win.signal(1, None));
            } else {
                wait(win.wait_signal(0, None));
                assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            }
            win.deregister(None).unwrap();
            comm.finalize().unwrap();
        },
    );
    let (_, after) = soft_fabric().stats();
    assert!(
        after - before >= len as u64,
        "the fabric moved {} bytes",
        after - before
    );
}

#[test]
fn ranks_that_disagree_on_ib_fail_init_quickly_instead_of_waiting() {
    // Rank 1 was not given `ib` in CTRAN_BACKENDS: its first collective meets rank 0's ib
    // set-up frame, and both ranks fail well before the 30 s timeout.
    let store: Arc<HashStore> = Arc::new(HashStore::new());
    let start = Instant::now();
    let outs: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let store = Arc::clone(&store);
                s.spawn(move || {
                    let mut cfg = CommConfig::from_env("ib-route-disagree", rank, 2).unwrap();
                    cfg.timeout = Duration::from_secs(30);
                    cfg.use_shm = false;
                    cfg.want_ib = rank == 0;
                    cfg.ib_provider = IbProvider::Soft;
                    Comm::init(cfg, store)
                        .map(|c| {
                            c.abort("test over");
                        })
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    for (rank, r) in outs.iter().enumerate() {
        assert!(r.is_err(), "rank {rank} initialised: {r:?}");
    }
    let e0 = outs[0].as_ref().unwrap_err();
    assert!(e0.contains("CTRAN_BACKENDS"), "{e0}");
}

/// Buffers registered with the communicator (as the GPU progress engine registers its pinned
/// staging) move in place over ib: a ring of sends and receives and an all_gather into
/// registered memory arrive intact, and the transfers in place are counted; without the
/// registration the same work stages.
#[test]
fn registered_buffers_move_in_place_through_the_communicator() {
    use ctran::transport::ib::UserDevice;
    const LEN: usize = 100_000;
    for register in [true, false] {
        let name = format!("ib-in-place-{register}");
        let outs = with_ranks(
            3,
            &name,
            |_, _| {},
            |c| {
                let (me, n) = (c.rank(), c.size());
                // One registered buffer: the outgoing message, the incoming one, then the
                // all_gather's output.
                let mut buf = vec![0u32; LEN * (2 + n)];
                let whole = span_of(&mut buf);
                if register {
                    // SAFETY: `buf` outlives the registration (deregistered below).
                    assert!(unsafe { c.register_buffer(whole, UserDevice::Host) }.unwrap());
                }
                for (i, x) in buf[..LEN].iter_mut().enumerate() {
                    *x = (me * LEN + i) as u32;
                }
                let words = |from: usize, count: usize| whole.sub(from * 4, count * 4);
                let ring = Op::Batch {
                    ops: vec![
                        ctran::P2p::Send {
                            buf: words(0, LEN),
                            peer: (me + 1) % n,
                        },
                        ctran::P2p::Recv {
                            buf: words(LEN, LEN),
                            peer: (me + n - 1) % n,
                        },
                    ],
                };
                c.run(ring, None).unwrap();
                let gather = Op::AllGather {
                    input: words(0, LEN),
                    outputs: (0..n).map(|r| words((2 + r) * LEN, LEN)).collect(),
                };
                c.run(gather, None).unwrap();
                let moved = c.moved_in_place().unwrap();
                if register {
                    c.deregister_buffer(whole);
                }
                c.finalize().unwrap();
                let prev = (me + n - 1) % n;
                let ring_ok = (0..LEN).all(|i| buf[LEN + i] == (prev * LEN + i) as u32);
                let gather_ok = (0..n)
                    .all(|r| (0..LEN).all(|i| buf[(2 + r) * LEN + i] == (r * LEN + i) as u32));
                (ring_ok && gather_ok, moved)
            },
        );
        for (rank, (ok, moved)) in outs.into_iter().enumerate() {
            assert!(ok, "registered {register}: rank {rank} received wrong data");
            if register {
                // Its ring send and receive at least; the all_gather's too.
                assert!(moved >= 2, "rank {rank}: {moved} transfers in place");
            } else {
                assert_eq!(moved, 0, "rank {rank}: nothing was registered");
            }
        }
    }
}
