//! The transport among ranks of one process: several attach to one segment from threads.

use super::*;
use crate::transport::tag::TagKind;

/// `n` local ranks of one communicator, attached to a fresh segment.
fn local_ranks(n: usize) -> Vec<ShmTransport> {
    let name = format!(
        "/tc-shm-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let cfg = ShmConfig {
        fifo_slots: 2,
        fifo_slot_bytes: 256,
        coll_bytes: 256,
        spin: Some(Duration::from_micros(10)),
        cma: false,
        ..ShmConfig::default()
    };
    let ranks: Vec<usize> = (0..n).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        let joins: Vec<_> = (0..n)
            .map(|r| {
                let (name, cfg, ranks) = (&name, &cfg, &ranks);
                s.spawn(move || {
                    ShmTransport::attach(name, r, n, ranks, n, cfg, deadline, &mut || Ok(()))
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().unwrap().unwrap())
            .collect()
    })
}

fn shm_test_config() -> ShmConfig {
    ShmConfig {
        fifo_slots: 2,
        fifo_slot_bytes: 256,
        coll_bytes: 256,
        cma: false,
        ..ShmConfig::default()
    }
}

/// A local peer that died during set-up (its connection closed) fails the waiting rank in
/// moments, not at the deadline, and the segment's name is gone from /dev/shm either way: the
/// creator waiting for the dead peer unlinks it, and so does a rank whose creator died.
#[test]
fn a_peer_dying_during_set_up_fails_fast_and_leaves_no_segment() {
    let dead = || {
        Err(TransportError::PeerLost {
            peer: 1,
            reason: "connection closed by peer".into(),
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = Instant::now();
    // The creator waits for rank 1, which died.
    let name = format!(
        "/tc-shm-dead-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let cfg = shm_test_config();
    let err = ShmTransport::attach(&name, 0, 2, &[0, 1], 2, &cfg, deadline, &mut dead.clone())
        .expect_err("set-up fails");
    assert!(err.to_string().contains("peer 1"), "{err}");
    assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    // Rank 1 waits for a creator that died after creating the segment.
    let name = format!(
        "/tc-shm-dead-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let orphan = segment::Segment::create(&name, 4096).expect("create");
    std::mem::forget(orphan);
    assert!(std::path::Path::new(&format!("/dev/shm{name}")).exists());
    let err = ShmTransport::attach(&name, 1, 2, &[0, 1], 2, &cfg, deadline, &mut dead.clone())
        .expect_err("set-up fails");
    assert!(err.to_string().contains("peer 1"), "{err}");
    assert!(!std::path::Path::new(&format!("/dev/shm{name}")).exists());
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The flaky "order" case, made deterministic: rank 0 runs a barrier (waiting for peer 2)
/// while its peers run an all_reduce with the same sequence number, and peer 1 already aborted
/// (its notice is reported again on every liveness check). That known failure must not hide
/// the disagreement: the receive fails with it at the agreement check instead of waiting for
/// the timeout.
#[test]
fn a_known_peer_failure_does_not_hide_a_disagreement() {
    let mut ranks = local_ranks(3);
    let barrier = OpTag::collective(TagKind::Barrier, 3, None, None, None);
    let all_reduce = OpTag::collective(
        TagKind::AllReduce,
        3,
        Some(crate::DataType::F32),
        Some(crate::ReduceOp::Sum),
        None,
    );
    ranks[1].node.publish_op(all_reduce);
    ranks[2].node.publish_op(all_reduce);
    let me = &mut ranks[0];
    me.node.publish_op(barrier);
    let mut buf = [0u8; 8];
    // SAFETY: `buf` outlives the request, which fails before the test returns.
    let req = me
        .post_recv(2, unsafe { Span::from_slice(&mut buf) }, barrier)
        .unwrap();
    let notice = TransportError::PeerLost {
        peer: 1,
        reason: "peer 1 failed: it disagrees".into(),
    };
    let mut alive = || Err(notice.clone());
    let start = Instant::now();
    let outcome = loop {
        me.progress(Instant::now() + Duration::from_millis(2), &mut alive)
            .unwrap();
        match me.test(req) {
            Ok(false) if start.elapsed() < Duration::from_secs(3) => {}
            other => break other,
        }
    };
    assert!(
        matches!(outcome, Err(TransportError::Disagree { got, .. }) if got == all_reduce),
        "{outcome:?} after {:?}",
        start.elapsed()
    );
}
