//! Virtual QP and CQ over the software provider: both modes, 1..8 QPs, awkward sizes, large
//! puts, reordered and partial completions, injected errors, flushes, a vanishing peer and
//! out-of-bounds writes.

mod common;

use std::time::Duration;

use common::{cfg, pair, pattern, shuffled, Pair};
use ibverbx::soft::SoftConfig;
use ibverbx::{Error, Put, RemoteKey, VcMode, VqpConfig, WcStatus};

const T: Duration = Duration::from_secs(20);

/// Puts `sizes` back to back (unaligned offsets), each notified, and checks bytes, order and
/// notifications.
fn round_trip(p: &mut Pair, sizes: &[usize]) {
    let total: usize = sizes.iter().map(|s| s + 13).sum::<usize>() + 16;
    let src = p.a.register(total);
    let dst = p.b.register(total + 64);
    let mut off = 3usize;
    let mut expect = Vec::new();
    for (i, &len) in sizes.iter().enumerate() {
        let data = pattern(i as u64 + 1, len);
        src.write(off, &data).unwrap();
        let msg =
            p.tx.put(&Put {
                wr_id: 1000 + i as u64,
                local: src.local_key(),
                local_offset: off as u64,
                remote: dst.remote_key(),
                remote_offset: off as u64 + 5,
                len: len as u64,
                notify: true,
            })
            .unwrap();
        assert_eq!(msg, i as u64);
        expect.push((off + 5, data));
        off += len + 13;
    }
    let seen = p.drive(sizes.len(), sizes.len(), T);
    for (i, (msg, wr_id, r)) in seen.done.iter().enumerate() {
        assert_eq!(
            (*msg, *wr_id),
            (i as u64, 1000 + i as u64),
            "puts complete in order"
        );
        assert!(r.is_ok(), "put {i}: {r:?}");
    }
    assert_eq!(seen.notes, (0..sizes.len() as u64).collect::<Vec<_>>());
    assert!(seen.recv_failed.is_empty(), "{:?}", seen.recv_failed);
    let got = dst.to_vec().unwrap();
    for (i, (at, data)) in expect.iter().enumerate() {
        assert!(
            got[*at..*at + data.len()] == data[..],
            "bytes of put {i} ({} bytes)",
            data.len()
        );
    }
}

#[test]
fn both_modes_every_qp_count_awkward_sizes() {
    let sizes = [0, 1, 7, 4095, 4096, 4097, 3 * 4096, 8 * 4096, 100_003, 1];
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        for nqps in [1, 2, 3, 4, 5, 8] {
            for seed in [1, 2] {
                let mut p = pair(nqps, cfg(mode, 4096), shuffled(seed * 100 + nqps as u64));
                round_trip(&mut p, &sizes);
            }
        }
    }
}

#[test]
fn in_order_delivery_without_shuffling_and_equal_split() {
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        let mut p = pair(4, cfg(mode, 0), SoftConfig::default());
        round_trip(&mut p, &[10, 4, 3, 4096 * 4 + 1, 0]);
    }
}

#[test]
fn large_put_64_mib() {
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        let mut p = pair(4, cfg(mode, 512 << 10), shuffled(9));
        round_trip(&mut p, &[64 << 20]);
    }
}

#[test]
fn tight_outstanding_limit_queues_chunks() {
    let c = VqpConfig {
        chunk_bytes: 1024,
        mode: VcMode::Dqplb,
        max_msgs_per_qp: 1,
        ..VqpConfig::default()
    };
    let mut p = pair(3, c, shuffled(5));
    round_trip(&mut p, &[64 * 1024 + 17, 5, 3000]);
}

#[test]
fn sequence_numbers_wrap_in_the_immediate() {
    // 4 sequence bits: 2 QPs x 3 outstanding stay under half the space; 300 chunks wrap ~19x.
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        let c = VqpConfig {
            chunk_bytes: 64,
            mode,
            max_msgs_per_qp: 3,
            seq_bits: 4,
        };
        let mut p = pair(2, c, shuffled(77));
        let sizes: Vec<usize> = (0..60).map(|i| (i * 37) % 300).collect();
        round_trip(&mut p, &sizes);
    }
    let too_many = VqpConfig {
        chunk_bytes: 64,
        mode: VcMode::Dqplb,
        max_msgs_per_qp: 8,
        seq_bits: 4,
    };
    let fabric = ibverbx::soft::SoftFabric::new(SoftConfig::default());
    let d = fabric.device("x");
    let cq = d.create_cq();
    let mut vcq = ibverbx::VirtualCq::<ibverbx::soft::Soft>::new(d.create_cq());
    let err = ibverbx::VirtualQp::new(&mut vcq, vec![d.create_qp(&cq)], too_many).unwrap_err();
    assert!(err.to_string().contains("sequence bits"), "{err}");
}

#[test]
fn unnotified_and_empty_puts() {
    let mut p = pair(2, cfg(VcMode::Dqplb, 4096), shuffled(3));
    let src = p.a.register(10_000);
    let dst = p.b.register(10_000);
    src.write(0, &pattern(1, 10_000)).unwrap();
    let put = |len: u64, notify: bool| Put {
        wr_id: len,
        local: src.local_key(),
        local_offset: 0,
        remote: dst.remote_key(),
        remote_offset: 0,
        len,
        notify,
    };
    p.tx.put(&put(0, false)).unwrap();
    p.tx.put(&put(9000, false)).unwrap();
    p.tx.put(&put(0, true)).unwrap();
    let seen = p.drive(3, 1, T);
    assert!(seen.done.iter().all(|d| d.2.is_ok()), "{seen:?}");
    assert_eq!(seen.notes, vec![0], "only the notified put notifies");
    // The notification of the third put came after the second's bytes were in place.
    assert_eq!(dst.to_vec().unwrap()[..9000], pattern(1, 10_000)[..9000]);
}

/// Eight puts of four chunks on four QPs: chunk k goes to QP k % 4, so QP 2 carries chunk 2
/// of every put. Its sixth write (put 5, chunk 2) fails with retry exceeded.
#[test]
fn retry_exceeded_lands_on_the_right_put_and_later_ones_flush() {
    let mut p = pair(4, cfg(VcMode::Dqplb, 4096), SoftConfig::default());
    let qp2 = p.tx.qp_nums()[2];
    p.fabric.inject(qp2, 5, WcStatus::RetryExceeded).unwrap();
    let src = p.a.register(16384);
    let dst = p.b.register(16384);
    for i in 0..8 {
        p.tx.put(&Put {
            wr_id: i,
            local: src.local_key(),
            local_offset: 0,
            remote: dst.remote_key(),
            remote_offset: 0,
            len: 16384,
            notify: true,
        })
        .unwrap();
    }
    let seen = p.drive(8, 5, T);
    for (msg, _, r) in &seen.done[..5] {
        assert!(r.is_ok(), "put {msg} completed before the failure: {r:?}");
    }
    let f5 = seen.done[5].2.clone().unwrap_err();
    assert_eq!(f5.status, WcStatus::RetryExceeded, "{f5}");
    assert!(
        f5.detail.contains("put #5") && f5.detail.contains("chunk 2 of 4"),
        "{f5}"
    );
    for (msg, _, r) in &seen.done[6..] {
        let f = r.clone().unwrap_err();
        assert_eq!(f.status, WcStatus::WrFlush, "put {msg}: {f}");
    }
    // The receiver saw puts 0..=4 whole; put 5 never completes there.
    assert_eq!(seen.notes, vec![0, 1, 2, 3, 4]);
    let err =
        p.tx.put(&Put {
            wr_id: 99,
            local: src.local_key(),
            local_offset: 0,
            remote: dst.remote_key(),
            remote_offset: 0,
            len: 1,
            notify: false,
        })
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Completion {
                status: WcStatus::RetryExceeded,
                ..
            }
        ) && err.to_string().contains("put #5"),
        "{err}"
    );
    assert_eq!(p.tx.broken().unwrap().status, WcStatus::RetryExceeded);
}

#[test]
fn qp_error_flushes_everything_outstanding() {
    let mut p = pair(2, cfg(VcMode::Spray, 1024), SoftConfig::default());
    let src = p.a.register(8192);
    let dst = p.b.register(8192);
    for i in 0..4 {
        p.tx.put(&Put {
            wr_id: i,
            local: src.local_key(),
            local_offset: 0,
            remote: dst.remote_key(),
            remote_offset: 0,
            len: 8192,
            notify: true,
        })
        .unwrap();
    }
    // Nothing ran yet (the fabric runs on polls): QP 1's writes all flush.
    p.fabric.fail_qp(p.tx.qp_nums()[1]);
    let mut seen = p.drive(4, 0, T);
    for (msg, _, r) in &seen.done {
        let f = r.clone().unwrap_err();
        assert_eq!(f.status, WcStatus::WrFlush, "put {msg}: {f}");
    }
    // The failed QP's posted receives flush too: the sender's receiving side reports it once.
    while seen.recv_failed.is_empty() {
        p.drive_into(&mut seen, 4, 0, T);
        let mut ev = Vec::new();
        p.vcq_a.wait(&mut ev, T).ok();
        for e in ev {
            if let ibverbx::Event::RecvFailed(f) = e.event {
                seen.recv_failed.push(("a", f));
            }
        }
    }
    assert_eq!(seen.recv_failed[0].1.status, WcStatus::WrFlush);
    assert!(
        seen.notes.is_empty(),
        "spray sends no notification for failed puts"
    );
}

#[test]
fn peer_that_disappears_fails_the_sender_without_hanging() {
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        let mut p = pair(4, cfg(mode, 4096), shuffled(11));
        let src = p.a.register(65536);
        let dst = p.b.register(65536);
        let put = Put {
            wr_id: 1,
            local: src.local_key(),
            local_offset: 0,
            remote: dst.remote_key(),
            remote_offset: 0,
            len: 65536,
            notify: true,
        };
        p.tx.put(&put).unwrap();
        let mut seen = p.drive(1, 1, T);
        assert!(seen.done[0].2.is_ok());
        drop(p.rx.take()); // the peer's QPs are destroyed
        p.tx.put(&Put { wr_id: 2, ..put }).unwrap();
        p.drive_into(&mut seen, 2, 1, T);
        let f = seen.done[1].2.clone().unwrap_err();
        assert_eq!(f.status, WcStatus::RetryExceeded, "{mode:?}: {f}");
        assert!(p.tx.put(&Put { wr_id: 3, ..put }).is_err());
    }
}

#[test]
fn out_of_bounds_writes_are_refused_never_performed() {
    let mut p = pair(2, cfg(VcMode::Dqplb, 4096), SoftConfig::default());
    let src = p.a.register(8192);
    let dst = p.b.register(4096);
    let neighbour = p.b.register(4096);
    src.write(0, &[0xAB; 8192]).unwrap();
    let put = Put {
        wr_id: 1,
        local: src.local_key(),
        local_offset: 0,
        remote: dst.remote_key(),
        remote_offset: 1,
        len: 4096,
        notify: true,
    };
    // Checked before posting against the keys' lengths.
    assert!(matches!(p.tx.put(&put), Err(Error::OutOfBounds { .. })));
    // A peer key that lies about its length passes that check; the responder refuses it.
    let forged = RemoteKey {
        len: 1 << 20,
        ..dst.remote_key()
    };
    p.tx.put(&Put {
        remote: forged,
        len: 8192,
        remote_offset: 0,
        ..put
    })
    .unwrap();
    let seen = p.drive(1, 0, T);
    let f = seen.done[0].2.clone().unwrap_err();
    assert!(
        matches!(f.status, WcStatus::RemoteAccess | WcStatus::WrFlush),
        "{f}"
    );
    let stats_after = p.fabric.stats();
    assert_eq!(
        neighbour.to_vec().unwrap(),
        vec![0; 4096],
        "nothing written past the region"
    );
    assert!(dst.to_vec().unwrap()[..4096]
        .iter()
        .all(|&b| b == 0 || b == 0xAB));
    // The chunk that crosses the end (the second, at 4096) is the remote access error.
    let mut q = pair(1, cfg(VcMode::Dqplb, 4096), SoftConfig::default());
    let s2 = q.a.register(8192);
    let d2 = q.b.register(4096);
    q.tx.put(&Put {
        wr_id: 7,
        local: s2.local_key(),
        local_offset: 0,
        remote: RemoteKey {
            len: 1 << 20,
            ..d2.remote_key()
        },
        remote_offset: 0,
        len: 8192,
        notify: false,
    })
    .unwrap();
    let seen = q.drive(1, 0, T);
    let f = seen.done[0].2.clone().unwrap_err();
    assert_eq!(f.status, WcStatus::RemoteAccess, "{f}");
    assert!(f.detail.contains("chunk 1 of 2"), "{f}");
    // A bad local key is a local protection error.
    let mut r = pair(1, cfg(VcMode::Dqplb, 4096), SoftConfig::default());
    let d3 = r.b.register(64);
    let s3 = r.a.register(64);
    r.tx.put(&Put {
        wr_id: 8,
        local: ibverbx::LocalKey {
            lkey: 0xdead,
            ..s3.local_key()
        },
        local_offset: 0,
        remote: d3.remote_key(),
        remote_offset: 0,
        len: 64,
        notify: false,
    })
    .unwrap();
    let seen = r.drive(1, 0, T);
    assert_eq!(
        seen.done[0].2.clone().unwrap_err().status,
        WcStatus::LocalProtection
    );
    let _ = stats_after;
}

#[test]
fn many_small_puts_under_heavy_reordering() {
    for seed in 0..5 {
        let mut p = pair(8, cfg(VcMode::Dqplb, 16), shuffled(seed));
        let sizes: Vec<usize> = (0..200).map(|i| (i * 13 + seed as usize) % 97).collect();
        round_trip(&mut p, &sizes);
    }
}

#[test]
fn wait_has_a_deadline() {
    let mut p = pair(1, cfg(VcMode::Dqplb, 4096), SoftConfig::default());
    let mut ev = Vec::new();
    let err = p
        .vcq_b
        .wait(&mut ev, Duration::from_millis(20))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
}

#[test]
fn a_qp_of_another_fabric_is_refused_at_connect() {
    use ibverbx::soft::SoftFabric;
    let (one, other) = (
        SoftFabric::new(SoftConfig::default()),
        SoftFabric::new(SoftConfig::default()),
    );
    let (a, b) = (one.device("a"), other.device("b"));
    let (cq_a, cq_b) = (a.create_cq(), b.create_cq());
    let (mut qa, qb) = (a.create_qp(&cq_a), b.create_qp(&cq_b));
    // QP numbers start alike on every fabric: only the fabric's id tells them apart.
    let e = qa.connect(&qb.endpoint()).unwrap_err();
    assert!(e.to_string().contains("another software fabric"), "{e}");
    let qa2 = a.create_qp(&cq_a);
    qa.connect(&qa2.endpoint()).unwrap();
}
