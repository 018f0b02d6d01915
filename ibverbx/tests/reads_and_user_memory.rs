//! RDMA reads (`VirtualQp::get`) over the software provider, mixed with puts, and regions
//! registered over the caller's own memory (zero copy) or a dma-buf.

mod common;

use std::time::Duration;

use common::{cfg, pair, pattern, shuffled};
use ibverbx::soft::{SoftConfig, SoftFabric};
use ibverbx::{CqOps, Error, Put, QpOps, RdmaOp, VcMode, WcOpcode, WcStatus, WorkRequest};

const T: Duration = Duration::from_secs(20);

#[test]
fn gets_bring_the_peers_bytes_in_order_with_puts() {
    let sizes = [0usize, 1, 4095, 4097, 3 * 4096 + 5, 100_003];
    for mode in [VcMode::Dqplb, VcMode::Spray] {
        for nqps in [1, 3, 4] {
            let mut p = pair(nqps, cfg(mode, 4096), shuffled(nqps as u64 + 40));
            let total: usize = sizes.iter().sum::<usize>() + 64;
            let remote = p.b.register(total);
            let local = p.a.register(total);
            let mut at = 7usize;
            let mut want = Vec::new();
            for (i, &len) in sizes.iter().enumerate() {
                let data = pattern(i as u64 + 3, len);
                remote.write(at, &data).unwrap();
                let get = Put {
                    wr_id: 500 + i as u64,
                    local: local.local_key(),
                    local_offset: at as u64 + 1,
                    remote: remote.remote_key(),
                    remote_offset: at as u64,
                    len: len as u64,
                    notify: false,
                };
                assert_eq!(p.tx.get(&get).unwrap(), 2 * i as u64);
                // A put between gets: completions stay in posting order.
                let put = Put {
                    wr_id: 900 + i as u64,
                    ..get
                };
                assert_eq!(
                    p.tx.put(&Put {
                        local_offset: 0,
                        remote_offset: (total - 8) as u64,
                        len: 0,
                        ..put
                    })
                    .unwrap(),
                    2 * i as u64 + 1
                );
                want.push((at + 1, data));
                at += len;
            }
            let seen = p.drive(2 * sizes.len(), 0, T);
            for (k, (msg, _, r)) in seen.done.iter().enumerate() {
                assert_eq!(*msg, k as u64, "completions in posting order");
                assert!(r.is_ok(), "{mode:?} x{nqps}: request {k}: {r:?}");
            }
            let got = local.to_vec().unwrap();
            for (i, (at, data)) in want.iter().enumerate() {
                assert!(
                    got[*at..*at + data.len()] == data[..],
                    "{mode:?} x{nqps}: bytes of get {i} ({} bytes)",
                    data.len()
                );
            }
        }
    }
}

#[test]
fn a_get_cannot_notify_and_stays_in_bounds() {
    let mut p = pair(2, cfg(VcMode::Dqplb, 1024), SoftConfig::default());
    let remote = p.b.register(4096);
    let local = p.a.register(4096);
    let get = Put {
        wr_id: 1,
        local: local.local_key(),
        local_offset: 0,
        remote: remote.remote_key(),
        remote_offset: 0,
        len: 4096,
        notify: true,
    };
    let e = p.tx.get(&get).unwrap_err();
    assert!(e.to_string().contains("cannot notify"), "{e}");
    let e =
        p.tx.get(&Put {
            notify: false,
            remote_offset: 1,
            ..get
        })
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    // A key that claims more than the peer registered: the fabric refuses, writes nothing.
    let mut lying = remote.remote_key();
    lying.len = 8192;
    p.tx.get(&Put {
        notify: false,
        remote: lying,
        len: 8192,
        local: ibverbx::LocalKey {
            len: 8192,
            ..local.local_key()
        },
        ..get
    })
    .unwrap();
    let seen = p.drive(1, 0, T);
    let f = seen.done[0].2.clone().unwrap_err();
    assert!(
        matches!(f.status, WcStatus::RemoteAccess | WcStatus::LocalProtection),
        "{f}"
    );
    assert!(f.detail.contains("get #0"), "{f}");
}

#[test]
fn a_read_with_immediate_data_is_malformed() {
    let fabric = SoftFabric::new(SoftConfig::default());
    let (a, b) = (fabric.device("a"), fabric.device("b"));
    let (mut cq_a, cq_b) = (a.create_cq(), b.create_cq());
    let (mut qa, _qb) = ibverbx::soft::connect_pairs(&a, &cq_a, &b, &cq_b, 1).unwrap();
    let (la, rb) = (a.register(64), b.register(64));
    let wr = WorkRequest {
        wr_id: 9,
        op: RdmaOp::Read,
        local_addr: la.local_key().addr,
        lkey: la.local_key().lkey,
        len: 64,
        remote_addr: rb.remote_key().addr,
        rkey: rb.remote_key().rkey,
        imm: Some(1),
    };
    qa[0].post_send(&wr).unwrap();
    let mut out = Vec::new();
    cq_a.poll(&mut out, 4).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].status, WcStatus::LocalQpOp);
    // Without the immediate data the same read runs and says so.
    drop(qa);
    let (mut qa, _qb) = ibverbx::soft::connect_pairs(&a, &cq_a, &b, &cq_b, 1).unwrap();
    rb.write(0, &[5; 64]).unwrap();
    qa[0].post_send(&WorkRequest { imm: None, ..wr }).unwrap();
    out.clear();
    cq_a.poll(&mut out, 4).unwrap();
    assert_eq!(
        (out[0].status, out[0].opcode),
        (WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(la.to_vec().unwrap(), vec![5; 64]);
}

#[test]
fn caller_memory_is_registered_in_place() {
    let mut p = pair(4, cfg(VcMode::Spray, 4096), shuffled(77));
    let mut theirs = pattern(11, 50_000);
    let mut mine = vec![0u8; 50_000];
    // SAFETY: both vectors outlive the regions (dropped at the end of the test, after them).
    let (remote, local) = unsafe {
        (
            p.b.register_raw(theirs.as_mut_ptr(), theirs.len()),
            p.a.register_raw(mine.as_mut_ptr(), mine.len()),
        )
    };
    assert_eq!(
        local.local_key().addr,
        mine.as_ptr() as u64,
        "the region is the memory"
    );
    let get = Put {
        wr_id: 1,
        local: local.local_key(),
        local_offset: 0,
        remote: remote.remote_key(),
        remote_offset: 0,
        len: 50_000,
        notify: false,
    };
    p.tx.get(&get).unwrap();
    // Then overwrite the first 1000 bytes of the peer's memory with a put of ours.
    p.tx.put(&Put {
        wr_id: 2,
        local_offset: 1000,
        len: 1000,
        ..get
    })
    .unwrap();
    let seen = p.drive(2, 0, T);
    assert!(seen.done.iter().all(|d| d.2.is_ok()), "{seen:?}");
    drop((remote, local));
    assert_eq!(
        mine,
        pattern(11, 50_000),
        "the get landed in the caller's vector"
    );
    assert_eq!(theirs[..1000], pattern(11, 50_000)[1000..2000]);
    assert_eq!(theirs[1000..], pattern(11, 50_000)[1000..]);
}

#[test]
fn a_dmabuf_registration_checks_its_descriptor() {
    struct NoEngine;
    impl ibverbx::soft::DmaEngine for NoEngine {
        unsafe fn copy(&self, _: u64, _: u64, _: usize) -> Result<(), String> {
            Err("never used".into())
        }
    }
    let fabric = SoftFabric::new(SoftConfig::default());
    let dev = fabric.device("a");
    let file = std::fs::File::open("/proc/self/status").unwrap();
    use std::os::fd::AsFd;
    // SAFETY: refused before any memory is touched.
    let e = unsafe {
        dev.register_dmabuf(file.as_fd(), 0, 4096, 0x1000, std::sync::Arc::new(NoEngine))
    }
    .unwrap_err();
    assert!(e.to_string().contains("not a dma-buf"), "{e}");
}
