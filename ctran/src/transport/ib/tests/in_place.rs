//! Buffers registered for transfers in place: the NIC writes from and into them directly, in
//! every combination with staged buffers, and registrations are checked and can be dropped.

use super::*;

const BUF: usize = 2 << 20;

/// Rank 0 and rank 1 each register one buffer and exchange messages from and into it, and
/// from or into plain (staged) memory: every combination arrives intact, and exactly the
/// transfers that touched a registered buffer moved in place.
fn both_ways(mode: VcMode) {
    let (_fabric, ts) = mesh(2, reordering(), mode);
    let ts = run(ts, |r, t| {
        let peer = 1 - r;
        let mut registered = vec![0u8; BUF];
        assert!(t
            .register_buffer(span(&mut registered), &UserDevice::Host)
            .unwrap());
        // (send from the registered buffer?, receive into it?) for this rank's message `k`;
        // the peer's message `k` is the mirror image.
        let cases = [(true, true), (true, false), (false, true), (false, false)];
        let len = (64 << 10) * 3 + 5;
        let mut plain_out: Vec<Vec<u8>> = Vec::new();
        let mut plain_in: Vec<Vec<u8>> = Vec::new();
        let mut reqs = Vec::new();
        let mut landed = Vec::new();
        for (k, &(from_reg, into_reg)) in cases.iter().enumerate() {
            let data = pattern(r, peer, k, len);
            // Outgoing messages in the first half of the buffer, incoming in the second.
            let src = if from_reg {
                let off = 4096 + k * len;
                registered[off..off + len].copy_from_slice(&data);
                span(&mut registered).sub(off, len)
            } else {
                plain_out.push(data);
                span(plain_out.last_mut().unwrap())
            };
            reqs.push(
                t.post_send(peer, src, OpTag::P2P, Delivery::Confirmed)
                    .unwrap(),
            );
            let dst = if into_reg {
                let off = BUF / 2 + 7 + k * len;
                landed.push((k, Some(off)));
                span(&mut registered).sub(off, len)
            } else {
                plain_in.push(vec![0u8; len]);
                landed.push((k, None));
                span(plain_in.last_mut().unwrap())
            };
            reqs.push(t.post_recv(peer, dst, OpTag::P2P).unwrap());
        }
        ok_all(t, &reqs);
        let mut plain = plain_in.iter();
        for (k, at) in landed {
            let want = pattern(peer, r, k, len);
            let got = match at {
                Some(off) => &registered[off..off + len],
                None => plain.next().unwrap().as_slice(),
            };
            assert!(got == want, "rank {r}: message {k} from {peer} differs");
        }
        // Sends from the buffer in cases 0 and 1, receives into it in cases 0 and 2.
        assert_eq!(t.in_place.moved, 4, "rank {r}");
        t.deregister_buffer(span(&mut registered));
    });
    assert_eq!(ts.len(), 2);
}

#[test]
fn registered_buffers_move_in_place_with_staged_ones_on_either_side() {
    both_ways(VcMode::Dqplb);
    both_ways(VcMode::Spray);
}

#[test]
fn overlapping_registrations_are_refused_and_deregistered_buffers_stage_again() {
    let (_fabric, mut ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
    let mut buf = vec![0u8; 8192];
    let whole = span(&mut buf);
    let t = &mut ts[0];
    assert!(t.register_buffer(whole, &UserDevice::Host).unwrap());
    let err = t
        .register_buffer(whole.sub(4096, 100), &UserDevice::Host)
        .unwrap_err();
    assert!(err.to_string().contains("overlaps"), "{err}");
    assert!(!t.register_buffer(Span::EMPTY, &UserDevice::Host).unwrap());
    t.deregister_buffer(whole);
    assert!(t.in_place.slice(whole.sub(0, 10)).is_none());
    // Registering again after deregistering works.
    assert!(t.register_buffer(whole, &UserDevice::Host).unwrap());

    let ts = run(ts, |r, t| {
        let mut out = pattern(r, 1 - r, 0, 5000);
        let mut inp = vec![0u8; 5000];
        let s = t.post_send(1 - r, span(&mut out), OpTag::P2P, Delivery::Eager);
        let q = t.post_recv(1 - r, span(&mut inp), OpTag::P2P).unwrap();
        ok_all(t, &[s.unwrap(), q]);
        assert_eq!(inp, pattern(1 - r, r, 0, 5000));
        assert_eq!(t.in_place.moved, 0, "rank {r}: nothing registered was used");
    });
    drop(ts);
}
