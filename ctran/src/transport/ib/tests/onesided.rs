//! One-sided operations over the software fabric: puts and signals in order, and every
//! refusal (out of bounds, deregistered, stale keys).

use super::*;

#[test]
fn puts_and_signals_land_in_order_and_are_checked() {
    puts_and_signals(VcMode::Dqplb);
    puts_and_signals(VcMode::Spray);
}

fn puts_and_signals(mode: VcMode) {
    let (_fabric, mut ts) = mesh(3, reordering(), mode);
    const LEN: usize = 300_000;
    let mut region = vec![0u8; LEN];
    let (id, key) = ts[2].register_region(span(&mut region), 9, None).unwrap();
    assert_ne!(key.rkey, 0);
    let key = RemoteKey::from_bytes(&key.to_bytes()).unwrap();
    let region_span = span(&mut region);
    run(ts, |r, t| match r {
        // Ranks 0 and 1 each write their half in pieces, then signal once per round.
        0 | 1 => {
            for round in 0..3u64 {
                let half = LEN / 2;
                let mut data = pattern(r, 2, round as usize, half);
                let mut reqs = Vec::new();
                for piece in 0..3 {
                    let len = half / 3;
                    let off = r * half + piece * len;
                    let src = span(&mut data).sub(piece * len, len);
                    if let Some(q) = t.post_put(2, src, &key, off as u64).unwrap() {
                        reqs.push(q);
                    }
                }
                reqs.push(t.post_signal(2, &key, SignalKind::Signal, 1).unwrap());
                ok_all(t, &reqs);
                // Wait until the target saw the round before overwriting it.
                let mut ack = [0u8; 1];
                let q = t.post_recv(2, span(&mut ack), OpTag::P2P).unwrap();
                ok_all(t, &[q]);
            }
            // Out of bounds: refused here.
            let mut one = [1u8; 2];
            let e = t
                .post_put(2, span(&mut one), &key, LEN as u64 - 1)
                .unwrap_err();
            assert!(e.to_string().contains("exceeds"), "{e}");
        }
        _ => {
            for round in 0..3u64 {
                for peer in 0..2 {
                    let start = Instant::now();
                    while t.region_counters(id, peer).unwrap().0 <= round {
                        assert!(start.elapsed() < DEADLINE, "signal {round} of {peer}");
                        t.peer_alive(peer).unwrap();
                        let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
                    }
                    // Signal seen: the round's data is there.
                    let half = LEN / 2;
                    let want = pattern(peer, 2, round as usize, half);
                    let mut got = vec![0u8; half];
                    region_span.sub(peer * half, half).copy_to_slice(&mut got);
                    let whole = half / 3 * 3;
                    assert!(got[..whole] == want[..whole], "round {round} of {peer}");
                }
                let mut reqs = Vec::new();
                let mut acks = [[0u8; 1]; 2];
                for (peer, a) in acks.iter_mut().enumerate() {
                    reqs.push(
                        t.post_send(peer, span(a), OpTag::P2P, Delivery::Eager)
                            .unwrap(),
                    );
                }
                ok_all(t, &reqs);
            }
        }
    });
    drop(region);
}

#[test]
fn the_fabric_refuses_what_the_key_allowed_and_deregistered_regions() {
    for case in ["past the end", "deregistered"] {
        let (_fabric, mut ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
        let mut region = vec![0u8; 4096];
        let (id, mut key) = ts[1].register_region(span(&mut region), 1, None).unwrap();
        let offset = if case == "past the end" {
            // A key that claims more than was registered: only the fabric can refuse.
            key.len *= 2;
            4096
        } else {
            assert!(ts[1].deregister_region(id));
            0
        };
        run(ts, |r, t| {
            if r == 0 {
                let mut data = vec![5u8; 100];
                let q = t
                    .post_put(1, span(&mut data), &key, offset)
                    .unwrap()
                    .unwrap();
                let e = wait_all(t, &[q]).remove(0).unwrap_err();
                assert!(
                    e.to_string().contains(&WcStatus::RemoteAccess.to_string()),
                    "{case}: {e}"
                );
                assert!(t.peer_alive(1).is_err());
            }
        });
        assert_eq!(region, vec![0u8; 4096], "{case}");
    }
}

#[test]
fn the_target_refuses_a_stale_key_the_fabric_let_through() {
    for what in ["put", "signal"] {
        let (_fabric, mut ts) = mesh(2, SoftConfig::default(), VcMode::Dqplb);
        let mut region = vec![0u8; 4096];
        let (id, key) = ts[1].register_region(span(&mut region), 1, None).unwrap();
        // Same registration (the fabric accepts the write), another generation.
        let stale = RemoteKey {
            generation: key.generation + 1,
            ..key
        };
        run(ts, |r, t| {
            if r == 0 {
                let mut data = vec![5u8; 100];
                let q = if what == "put" {
                    t.post_put(1, span(&mut data), &stale, 0).unwrap().unwrap()
                } else {
                    t.post_signal(1, &stale, SignalKind::Signal, 1).unwrap()
                };
                let _ = wait_all(t, &[q]);
                let start = Instant::now();
                let e = loop {
                    assert!(start.elapsed() < DEADLINE, "{what}: the refusal never came");
                    if let Err(e) = t.peer_alive(1) {
                        break e;
                    }
                    let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
                };
                assert!(e.to_string().contains("stale generation"), "{what}: {e}");
            } else {
                let start = Instant::now();
                while t.peer_alive(0).is_ok() {
                    assert!(start.elapsed() < DEADLINE, "{what}: never refused");
                    let _ = t.progress(Instant::now() + Duration::from_millis(1), false);
                }
                assert_eq!(t.region_counters(id, 0), Some((0, 0)), "{what}");
            }
        });
        assert_eq!(region, vec![0u8; 4096], "{what}: the region was written");
    }
}
