//! The ib transport over ibverbx's software fabric: ranks are threads, each owning its
//! transport and progressing it, driven through the [`Transport`] trait alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ibverbx::soft::{SoftConfig, SoftFabric};
use ibverbx::{VcMode, VqpConfig, WcStatus};

use super::*;
use crate::transport::tag::TagKind;

mod in_place;
mod onesided;

type Ib = IbTransport<SoftBackend>;

/// Every wait of these tests ends by then: a hang is a failure.
const DEADLINE: Duration = Duration::from_secs(20);

fn settings(mode: VcMode) -> IbSettings {
    IbSettings {
        qps_per_connection: 3,
        vqp: VqpConfig {
            chunk_bytes: 64 << 10,
            mode,
            max_msgs_per_qp: 16,
            ..VqpConfig::default()
        },
    }
}

/// `n` connected transports on one fabric (endpoints exchanged directly).
fn mesh(n: usize, cfg: SoftConfig, mode: VcMode) -> (SoftFabric, Vec<Ib>) {
    let fabric = SoftFabric::new(cfg);
    let mut ts: Vec<Ib> = (0..n)
        .map(|r| {
            let b = SoftBackend::new(fabric.device(&format!("rank{r}")));
            IbTransport::new(b, r, n, settings(mode)).unwrap()
        })
        .collect();
    for a in 0..n {
        for b in a + 1..n {
            let ea = ts[a].endpoint(b).unwrap();
            let eb = ts[b].endpoint(a).unwrap();
            ts[a].connect(b, &eb).unwrap();
            ts[b].connect(a, &ea).unwrap();
        }
    }
    (fabric, ts)
}

fn reordering() -> SoftConfig {
    SoftConfig {
        reorder: true,
        partial: true,
        seed: 7,
        ..SoftConfig::default()
    }
}

fn span(v: &mut [u8]) -> Span {
    // SAFETY: every buffer outlives the requests naming it (the tests wait for them all).
    unsafe { Span::from_slice(v) }
}

/// Waits for every request; the outcome of each, in order. Panics at the deadline.
fn wait_all(t: &mut Ib, reqs: &[ReqId]) -> Vec<Result<(), TransportError>> {
    let start = Instant::now();
    let mut out: Vec<Option<Result<(), TransportError>>> = vec![None; reqs.len()];
    while out.iter().any(Option::is_none) {
        assert!(
            start.elapsed() < DEADLINE,
            "rank {}: requests still pending after {DEADLINE:?}",
            t.rank()
        );
        let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
        for (i, r) in reqs.iter().enumerate() {
            if out[i].is_none() {
                match t.test(*r) {
                    Ok(true) => out[i] = Some(Ok(())),
                    Ok(false) => {}
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn ok_all(t: &mut Ib, reqs: &[ReqId]) {
    for (i, r) in wait_all(t, reqs).into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("rank {}: request {i}: {e}", t.rank()));
    }
}

/// Runs `f` on every rank in its own thread; a rank that is done keeps progressing until all
/// are (its peers may still need its acknowledgements and credits).
fn run<F>(ts: Vec<Ib>, f: F) -> Vec<Ib>
where
    F: Fn(usize, &mut Ib) + Sync,
{
    let n = ts.len();
    let finished = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = ts
            .into_iter()
            .enumerate()
            .map(|(r, mut t)| {
                let (f, finished) = (&f, &finished);
                s.spawn(move || {
                    f(r, &mut t);
                    finished.fetch_add(1, Ordering::SeqCst);
                    let start = Instant::now();
                    while finished.load(Ordering::SeqCst) < n && start.elapsed() < DEADLINE {
                        let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
                    }
                    t
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn pattern(src: usize, dst: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64 * 31 + src as u64 * 7 + dst as u64 * 13 + i as u64 * 101) as u8)
        .collect()
}

const DELIVERIES: [Delivery; 3] = [Delivery::Eager, Delivery::Confirmed, Delivery::Accepted];

/// Every rank sends every size with every delivery to every peer, all in flight at once.
fn all_to_all_sizes(n: usize, sizes: &[usize], cfg: SoftConfig, mode: VcMode) {
    let (_fabric, ts) = mesh(n, cfg, mode);
    let ts = run(ts, |r, t| {
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        let mut bufs = Vec::new();
        for peer in (0..n).filter(|&p| p != r) {
            for (i, &len) in sizes.iter().enumerate() {
                for (d, &delivery) in DELIVERIES.iter().enumerate() {
                    let k = i * 3 + d;
                    let mut out = pattern(r, peer, k, len);
                    sends.push(
                        t.post_send(peer, span(&mut out), OpTag::P2P, delivery)
                            .unwrap(),
                    );
                    let mut inp = vec![0u8; len];
                    recvs.push(t.post_recv(peer, span(&mut inp), OpTag::P2P).unwrap());
                    bufs.push((peer, k, out, inp));
                }
            }
        }
        ok_all(t, &sends);
        ok_all(t, &recvs);
        for (peer, k, _, inp) in &bufs {
            assert!(
                *inp == pattern(*peer, r, *k, inp.len()),
                "rank {r}: message {k} of {} B from {peer} differs",
                inp.len()
            );
        }
        // Every confirmed send was accepted.
        let start = Instant::now();
        while t.unconfirmed().unwrap() {
            assert!(start.elapsed() < DEADLINE, "confirmations never came");
            let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
        }
    });
    assert_eq!(ts.len(), n);
}

#[test]
fn sizes_and_deliveries_between_2_3_and_4_ranks() {
    let sizes = [0, 1, 7, 4097, (64 << 10) * 3 + 5];
    for n in [2, 3, 4] {
        all_to_all_sizes(n, &sizes, reordering(), VcMode::Dqplb);
    }
    all_to_all_sizes(3, &sizes, reordering(), VcMode::Spray);
}

#[test]
fn large_messages_span_many_chunks() {
    all_to_all_sizes(2, &[9 << 20], reordering(), VcMode::Dqplb);
    all_to_all_sizes(2, &[(9 << 20) + 3], SoftConfig::default(), VcMode::Spray);
}

#[test]
fn either_side_may_post_late() {
    let (_fabric, ts) = mesh(2, reordering(), VcMode::Dqplb);
    run(ts, |r, t| {
        let peer = 1 - r;
        for round in 0..2 {
            // Round 0: the receiver (rank 1) posts late; round 1: the sender (rank 0) does.
            let late = (r == 1) == (round == 0);
            if late {
                let until = Instant::now() + Duration::from_millis(30);
                while Instant::now() < until {
                    let _ = t.progress(until, false);
                }
            }
            let len = 1000 + round;
            let req = if r == 0 {
                let mut out = pattern(0, 1, round, len);
                let q = t.post_send(peer, span(&mut out), OpTag::P2P, Delivery::Accepted);
                let q = q.unwrap();
                ok_all(t, &[q]);
                continue;
            } else {
                let mut inp = vec![0u8; len];
                let q = t.post_recv(peer, span(&mut inp), OpTag::P2P).unwrap();
                ok_all(t, &[q]);
                assert_eq!(inp, pattern(0, 1, round, len));
                q
            };
            let _ = req;
        }
    });
}

#[test]
fn many_messages_in_flight_arrive_in_order_both_ways() {
    // Far more messages than ring slots, both directions at once: the credits must flow.
    let (_fabric, ts) = mesh(2, reordering(), VcMode::Dqplb);
    const MSGS: usize = 500;
    run(ts, |r, t| {
        let peer = 1 - r;
        let mut outs: Vec<Vec<u8>> = (0..MSGS).map(|i| pattern(r, peer, i, 8 + i % 5)).collect();
        let mut ins: Vec<Vec<u8>> = (0..MSGS).map(|i| vec![0u8; 8 + i % 5]).collect();
        let mut reqs = Vec::new();
        for (o, i) in outs.iter_mut().zip(ins.iter_mut()) {
            reqs.push(
                t.post_send(peer, span(o), OpTag::P2P, Delivery::Eager)
                    .unwrap(),
            );
            reqs.push(t.post_recv(peer, span(i), OpTag::P2P).unwrap());
        }
        ok_all(t, &reqs);
        for (k, i) in ins.iter().enumerate() {
            assert_eq!(*i, pattern(peer, r, k, i.len()), "message {k}");
        }
    });
}

fn all_reduce_tag(seq: u64) -> OpTag {
    OpTag::collective(TagKind::AllReduce, seq, None, None, None)
}

#[test]
fn a_disagreement_fails_both_sides() {
    for (tag_of_1, len_of_1) in [(all_reduce_tag(2), 64), (all_reduce_tag(1), 65)] {
        let (_fabric, ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
        run(ts, |r, t| {
            let res = if r == 0 {
                let mut out = vec![1u8; 64];
                let tag = all_reduce_tag(1);
                let q = t
                    .post_send(1, span(&mut out), tag, Delivery::Eager)
                    .unwrap();
                wait_all(t, &[q]).remove(0)
            } else {
                let mut inp = vec![0u8; len_of_1];
                let q = t.post_recv(0, span(&mut inp), tag_of_1).unwrap();
                wait_all(t, &[q]).remove(0)
            };
            let e = res.unwrap_err();
            if len_of_1 == 64 {
                assert!(
                    matches!(e, TransportError::Disagree { peer, .. } if peer == 1 - r),
                    "rank {r}: {e}"
                );
            } else {
                // The sender finds it matching the receiver's clear-to-send; the receiver
                // hears of it from the sender.
                assert!(
                    matches!(e, TransportError::SizeMismatch { .. })
                        || matches!(e, TransportError::PostedMismatch { peer, .. } if peer == 1 - r),
                    "rank {r}: {e}"
                );
            }
            assert!(t.peer_alive(1 - r).is_err());
        });
    }
}

#[test]
fn retry_exceeded_fails_the_requests_of_both_sides() {
    let (fabric, ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
    for q in ts[0].qp_nums(1) {
        fabric.inject(q, 0, WcStatus::RetryExceeded).unwrap();
    }
    let start = Instant::now();
    run(ts, |r, t| {
        let mut buf = vec![3u8; 10_000];
        let q = if r == 0 {
            t.post_send(1, span(&mut buf), OpTag::P2P, Delivery::Accepted)
        } else {
            t.post_recv(0, span(&mut buf), OpTag::P2P)
        };
        let e = wait_all(t, &[q.unwrap()]).remove(0).unwrap_err();
        assert!(
            matches!(e, TransportError::PeerLost { .. }),
            "rank {r}: {e}"
        );
        assert!(t.peer_alive(1 - r).is_err());
        let mut more = [0u8; 1];
        assert!(t.post_recv(1 - r, span(&mut more), OpTag::P2P).is_err());
    });
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_peer_that_disappears_fails_pending_requests() {
    let (_fabric, mut ts) = mesh(3, reordering(), VcMode::Dqplb);
    drop(ts.pop()); // rank 2 is gone: its queue pairs are destroyed
    run(ts, |r, t| {
        let mut buf = vec![0u8; 100];
        let mut ok = vec![r as u8; 10];
        let lost = t.post_recv(2, span(&mut buf), OpTag::P2P).unwrap();
        // The surviving pair still talks.
        let s = t.post_send(1 - r, span(&mut ok), OpTag::P2P, Delivery::Eager);
        let mut inp = vec![0u8; 10];
        let rcv = t.post_recv(1 - r, span(&mut inp), OpTag::P2P).unwrap();
        let res = wait_all(t, &[lost, s.unwrap(), rcv]);
        assert!(
            matches!(&res[0], Err(TransportError::PeerLost { peer: 2, .. })),
            "{res:?}"
        );
        assert!(res[1].is_ok() && res[2].is_ok(), "{res:?}");
        assert_eq!(inp, vec![(1 - r) as u8; 10]);
        assert!(t.peer_alive(2).is_err());
    });
}

#[test]
fn abort_fails_everything_and_tells_the_peers() {
    let (_fabric, ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
    run(ts, |r, t| {
        let mut buf = vec![0u8; 100];
        let q = t.post_recv(1 - r, span(&mut buf), OpTag::P2P).unwrap();
        if r == 0 {
            t.abort("test abort");
            assert_eq!(t.test(q), Err(TransportError::Aborted));
            assert_eq!(
                t.post_recv(1, span(&mut buf), OpTag::P2P),
                Err(TransportError::Aborted)
            );
        } else {
            let e = wait_all(t, &[q]).remove(0).unwrap_err();
            assert!(e.to_string().contains("test abort"), "{e}");
        }
    });
}

#[test]
fn endpoints_of_other_settings_are_refused() {
    let fabric = SoftFabric::new(SoftConfig::default());
    let mk = |mode| {
        IbTransport::new(SoftBackend::new(fabric.device("x")), 0, 2, settings(mode)).unwrap()
    };
    let (mut a, mut b) = (mk(VcMode::Dqplb), mk(VcMode::Spray));
    let eb = b.endpoint(0).unwrap();
    assert!(a.connect(1, &eb).unwrap_err().to_string().contains("mode"));
    assert!(a.connect(1, b"junk").is_err());
    let _ = a.endpoint(1).unwrap();
}

#[test]
fn the_verbs_backend_fails_as_a_value_without_a_device() {
    let cfg = ibverbx::IbConfig::default();
    let res = VerbsBackend::open("mlx5_0", 1, &cfg, 1);
    if !ibverbx::availability().is_available() {
        let e = res.unwrap_err();
        println!("verbs backend not opened, as expected without a device: {e}");
    } else if let Ok(b) = res {
        let t = IbTransport::new(b, 0, 1, IbSettings::from_config(&cfg));
        assert!(t.is_ok(), "{t:?}");
    }
}

#[test]
fn the_engine_algorithms_run_over_ib_between_3_thread_ranks() {
    use crate::algos::select::Algo;
    use crate::algos::staging::Staging;
    use crate::algos::{run_collective, OpCtx};
    use crate::comm::Op;
    use crate::types::{DataType, ReduceOp};

    const N: usize = 3;
    const LEN: usize = 100_003;
    let algos = [
        Algo::AllReduceRing,
        Algo::AllReduceHalvingDoubling,
        Algo::AllReduceDirect,
        Algo::AllReduceTree,
    ];
    let (_fabric, ts) = mesh(N, reordering(), VcMode::Dqplb);
    let value = |rank: usize, k: usize| ((rank + 1) * (k % 97)) as f32;
    let ran = AtomicUsize::new(0);
    run(ts, |r, t| {
        let mut staging = Staging::new(256 << 10);
        for (seq, algo) in algos.iter().enumerate() {
            let mut data: Vec<f32> = (0..LEN).map(|k| value(r, k)).collect();
            let buf = span(bytemuck::cast_slice_mut(&mut data));
            let op = Op::AllReduce {
                buf,
                dtype: DataType::F32,
                op: ReduceOp::Sum,
            };
            let seq = seq as u64 + 1;
            let mut cx = OpCtx::new(r, N, "all_reduce", seq, DEADLINE, t, &mut staging)
                .with_tag(op.tag(seq));
            run_collective(&mut cx, &op, Some(*algo)).unwrap_or_else(|e| panic!("{algo}: {e}"));
            for (k, x) in data.iter().enumerate() {
                let want: f32 = (0..N).map(|q| value(q, k)).sum();
                assert_eq!(*x, want, "{algo}: rank {r}, element {k}");
            }
            ran.fetch_add(1, Ordering::SeqCst);
        }
    });
    assert_eq!(ran.load(Ordering::SeqCst), N * algos.len());
}

#[test]
fn ranks_waiting_in_different_collectives_both_fail() {
    // Neither rank sends: each waits to receive, in another collective of the same number.
    let (_fabric, ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
    run(ts, |r, t| {
        let tag = if r == 0 {
            all_reduce_tag(5)
        } else {
            OpTag::collective(TagKind::Broadcast, 5, None, None, Some(1))
        };
        t.begin_collective(tag);
        let mut buf = vec![0u8; 16];
        let q = t.post_recv(1 - r, span(&mut buf), tag).unwrap();
        let e = wait_all(t, &[q]).remove(0).unwrap_err();
        assert!(
            matches!(e, TransportError::Disagree { expected, .. } if expected == tag),
            "rank {r}: {e}"
        );
    });
}

#[test]
fn endpoints_travel_through_the_store() {
    use crate::bootstrap::HashStore;
    const N: usize = 4;
    let fabric = SoftFabric::new(reordering());
    let store = HashStore::new();
    let ts: Vec<Ib> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..N)
            .map(|r| {
                let (fabric, store) = (&fabric, &store);
                s.spawn(move || {
                    let b = SoftBackend::new(fabric.device(&format!("rank{r}")));
                    let mut t = IbTransport::new(b, r, N, settings(VcMode::Spray)).unwrap();
                    t.connect_through_store(store, "comm0", KEY, DEADLINE)
                        .unwrap();
                    t
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // A ring of messages proves every connection is the right one.
    run(ts, |r, t| {
        let mut out = pattern(r, (r + 1) % N, 0, 5000);
        let mut inp = vec![0u8; 5000];
        let s = t.post_send((r + 1) % N, span(&mut out), OpTag::P2P, Delivery::Accepted);
        let q = t
            .post_recv((r + N - 1) % N, span(&mut inp), OpTag::P2P)
            .unwrap();
        ok_all(t, &[s.unwrap(), q]);
        assert_eq!(inp, pattern((r + N - 1) % N, r, 0, 5000));
    });
}

/// The communicator's mesh key in the store tests.
const KEY: &[u8] = b"the mesh key of communicator 0 ";

#[test]
fn endpoints_that_fail_authentication_are_refused() {
    use super::setup::endpoint_mac;
    use crate::bootstrap::{HashStore, Store};
    let fabric = SoftFabric::new(SoftConfig::default());
    let ib = |r: usize| {
        let b = SoftBackend::new(fabric.device(&format!("rank{r}")));
        IbTransport::new(b, r, 2, settings(VcMode::Dqplb)).unwrap()
    };
    let short = Duration::from_millis(200);
    // Rank 1 published under another key (another job's, or a forger without the key).
    let store = HashStore::new();
    let mut other = ib(1);
    let mut ep = other.endpoint(0).unwrap();
    ep.extend_from_slice(&endpoint_mac(b"another key", "comm0", 1, 0, &ep));
    store.set("comm0/ib/1/0", &ep).unwrap();
    let e = ib(0)
        .connect_through_store(&store, "comm0", KEY, short)
        .unwrap_err();
    assert!(
        matches!(&e, IbError::BadEndpoint { peer: 1, reason, .. } if reason.contains("authentication")),
        "{e}"
    );
    // The right key, but one byte of the endpoint changed (a QP number pointed elsewhere).
    let mut ep = other.endpoint(0).unwrap();
    let tag = endpoint_mac(KEY, "comm0", 1, 0, &ep);
    ep[12] ^= 1;
    ep.extend_from_slice(&tag);
    store.set("comm0/ib/1/0", &ep).unwrap();
    let e = ib(0)
        .connect_through_store(&store, "comm0", KEY, short)
        .unwrap_err();
    assert!(matches!(e, IbError::BadEndpoint { peer: 1, .. }), "{e}");
    // An endpoint signed for another pair of ranks (replayed from rank 1 to rank 2).
    let ep = other.endpoint(0).unwrap();
    let mut signed = ep.clone();
    signed.extend_from_slice(&endpoint_mac(KEY, "comm0", 1, 2, &ep));
    store.set("comm0/ib/1/0", &signed).unwrap();
    let e = ib(0)
        .connect_through_store(&store, "comm0", KEY, short)
        .unwrap_err();
    assert!(matches!(e, IbError::BadEndpoint { peer: 1, .. }), "{e}");
    // Shorter than a MAC.
    store.set("comm0/ib/1/0", b"short").unwrap();
    let e = ib(0)
        .connect_through_store(&store, "comm0", KEY, short)
        .unwrap_err();
    assert!(matches!(e, IbError::BadEndpoint { peer: 1, .. }), "{e}");
}

#[test]
fn receives_failed_by_another_peers_disagreement_are_never_written() {
    use std::sync::atomic::AtomicBool;
    let (_fabric, ts) = mesh(3, SoftConfig::default(), VcMode::Dqplb);
    let failed = AtomicBool::new(false);
    run(ts, |r, t| match r {
        0 => {
            let mut from1 = vec![0u8; 32];
            let mut from2 = vec![0u8; 32];
            let q1 = t.post_recv(1, span(&mut from1), all_reduce_tag(1)).unwrap();
            let q2 = t.post_recv(2, span(&mut from2), all_reduce_tag(1)).unwrap();
            let res = wait_all(t, &[q1, q2]);
            assert!(res
                .iter()
                .all(|x| matches!(x, Err(TransportError::Disagree { peer: 1, .. }))));
            failed.store(true, Ordering::SeqCst);
            let until = Instant::now() + Duration::from_millis(100);
            while Instant::now() < until {
                let _ = t.progress(until, false);
            }
            assert_eq!(from2, vec![0u8; 32], "a failed receive was written");
        }
        1 => {
            let mut out = vec![1u8; 32];
            let q = t.post_send(0, span(&mut out), all_reduce_tag(2), Delivery::Eager);
            assert!(wait_all(t, &[q.unwrap()]).remove(0).is_err());
        }
        _ => {
            let start = Instant::now();
            while !failed.load(Ordering::SeqCst) {
                assert!(start.elapsed() < DEADLINE, "rank 0 never failed");
                let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
            }
            let mut out = vec![2u8; 32];
            let q = t.post_send(0, span(&mut out), all_reduce_tag(1), Delivery::Eager);
            ok_all(t, &[q.unwrap()]);
        }
    });
}

#[test]
fn a_confirmed_send_whose_receiver_is_lost_is_reported_by_unconfirmed() {
    let (_fabric, mut ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
    let mut t1 = ts.pop().unwrap();
    let mut t0 = ts.pop().unwrap();
    let mut out = vec![9u8; 100];
    let mut inp = vec![0u8; 100];
    let s = t0
        .post_send(1, span(&mut out), all_reduce_tag(1), Delivery::Confirmed)
        .unwrap();
    let r = t1.post_recv(0, span(&mut inp), all_reduce_tag(1)).unwrap();
    // Rank 1 progresses until its clear-to-send went out, then vanishes before acknowledging.
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < DEADLINE);
        let _ = t1.progress(Instant::now() + Duration::from_millis(1), false);
        let _ = t0.progress(Instant::now() + Duration::from_millis(1), false);
        if t0.test(s) == Ok(true) {
            break;
        }
    }
    let _ = r;
    drop(t1);
    assert!(t0.unconfirmed().unwrap() || t0.unconfirmed().is_err());
    let start = Instant::now();
    let e = loop {
        assert!(
            start.elapsed() < DEADLINE,
            "the lost receiver was never noticed"
        );
        let _ = t0.progress(Instant::now() + Duration::from_millis(1), false);
        match t0.unconfirmed() {
            Ok(true) => {}
            Ok(false) => panic!("the send was never acknowledged, yet nothing waits"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, TransportError::PeerLost { peer: 1, .. }), "{e}");
}

/// splitmix64, for reproducible random schedules.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[test]
fn random_schedules_over_random_settings() {
    for seed in 1..=6u64 {
        let n = 2 + (seed % 3) as usize;
        let mode = if seed % 2 == 0 {
            VcMode::Spray
        } else {
            VcMode::Dqplb
        };
        let cfg = SoftConfig {
            seed,
            reorder: true,
            partial: seed % 3 != 0,
            ..SoftConfig::default()
        };
        let fabric = SoftFabric::new(cfg);
        let s = IbSettings {
            qps_per_connection: 1 + (seed % 4) as usize,
            vqp: VqpConfig {
                chunk_bytes: 4096 << (seed % 5),
                mode,
                max_msgs_per_qp: if seed % 2 == 0 { 1 } else { 8 },
                ..VqpConfig::default()
            },
        };
        let mut ts: Vec<Ib> = (0..n)
            .map(|r| {
                let b = SoftBackend::new(fabric.device(&format!("rank{r}")));
                IbTransport::new(b, r, n, s).unwrap()
            })
            .collect();
        for a in 0..n {
            for b in a + 1..n {
                let (ea, eb) = (ts[a].endpoint(b).unwrap(), ts[b].endpoint(a).unwrap());
                ts[a].connect(b, &eb).unwrap();
                ts[b].connect(a, &ea).unwrap();
            }
        }
        // Messages src -> dst: both ends derive the same list of sizes.
        let sizes = |src: usize, dst: usize| -> Vec<usize> {
            let h = mix(seed ^ ((src as u64) << 8) ^ ((dst as u64) << 16));
            let count = 20 + (h % 60) as usize;
            (0..count)
                .map(|i| match mix(h + i as u64) % 10 {
                    0 => 0,
                    1..=6 => (mix(h ^ i as u64) % 300) as usize,
                    7 | 8 => (mix(h ^ i as u64) % 70_000) as usize,
                    _ => (mix(h ^ i as u64) % 600_000) as usize,
                })
                .collect()
        };
        run(ts, |r, t| {
            let mut ops = Vec::new(); // (peer, index, is_send)
            for peer in (0..n).filter(|&p| p != r) {
                ops.extend((0..sizes(r, peer).len()).map(|i| (peer, i, true)));
                ops.extend((0..sizes(peer, r).len()).map(|i| (peer, i, false)));
            }
            // Interleave at random, keeping each (peer, direction) in order: sort by a random
            // key that grows with the index.
            ops.sort_by_key(|&(p, i, s)| {
                let k = mix(seed ^ (r as u64) << 40 ^ (p as u64) << 32 ^ u64::from(s) << 31);
                (i as u64 * 1000 + k % 3000, p, s)
            });
            let mut bufs: Vec<(usize, usize, bool, Vec<u8>)> = Vec::new();
            let mut reqs = Vec::new();
            for &(peer, i, send) in &ops {
                let (src, dst) = if send { (r, peer) } else { (peer, r) };
                let len = sizes(src, dst)[i];
                let mut b = if send {
                    pattern(src, dst, i, len)
                } else {
                    vec![0u8; len]
                };
                let q = if send {
                    let d = DELIVERIES[(mix(seed + i as u64) % 3) as usize];
                    t.post_send(peer, span(&mut b), OpTag::P2P, d)
                } else {
                    t.post_recv(peer, span(&mut b), OpTag::P2P)
                };
                reqs.push(q.unwrap());
                bufs.push((peer, i, send, b));
                // Progress now and then while posting.
                if mix(seed ^ reqs.len() as u64) % 7 == 0 {
                    let _ = t.progress(Instant::now(), false);
                }
            }
            ok_all(t, &reqs);
            for (peer, i, send, b) in &bufs {
                if !send {
                    assert!(
                        *b == pattern(*peer, r, *i, b.len()),
                        "seed {seed}: rank {r}, message {i} from {peer} ({} B)",
                        b.len()
                    );
                }
            }
        });
    }
}
