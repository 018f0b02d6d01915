//! The TCP transport with its data path protected (`TORCHCOMMS_DATA_PROTECTION`): two ranks of
//! one process over loopback, each on its own thread. Messages of every size in both modes, a
//! relay that flips one byte on the wire, control frames (acknowledgements, probes, goodbyes,
//! abort notices) through the sealed path, and ranks that disagree about the mode.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use ctran::transport::socket::mesh::{connect_mesh, Listener, MeshPlan, SocketConfig};
use ctran::transport::socket::{Protection, SocketTransport};
use ctran::transport::{Delivery, OpTag, ReqId, Transport, TransportError};
use ctran::Span;

const MODES: [Protection; 2] = [Protection::Integrity, Protection::Encrypt];
/// Bytes the connector (rank 0) sends in the handshake before any frame: HELLO and its proof.
const HANDSHAKE_OUT: usize = 64 + 32;
const CHUNK: usize = Protection::CHUNK_BYTES;

/// Connects two ranks with `modes[r]`. With `flip_at`, rank 0 reaches rank 1 through a relay
/// that flips one bit of byte `flip_at` of what rank 0 sends.
fn connect(
    modes: [Protection; 2],
    flip_at: Option<usize>,
) -> [(ctran::Result<SocketTransport>, Duration); 2] {
    let listeners = [0, 1].map(|_| Listener::bind(Ipv4Addr::LOCALHOST.into()).unwrap());
    let addrs: Vec<SocketAddr> = listeners.iter().map(Listener::addr).collect();
    let mut seen_by_0 = addrs.clone();
    if let Some(at) = flip_at {
        seen_by_0[1] = relay(addrs[1], at);
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs(20);
    thread::scope(|s| {
        let ends: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let plan = MeshPlan {
                    comm: "protected".into(),
                    rank,
                    addrs: if rank == 0 {
                        seen_by_0.clone()
                    } else {
                        addrs.clone()
                    },
                    key: [7; 32],
                    handshake_timeout: Duration::from_secs(10),
                    protection: modes[rank],
                    local_pids: Vec::new(),
                };
                s.spawn(move || {
                    let r = connect_mesh(l, &plan, &SocketConfig::default(), deadline);
                    (r, start.elapsed())
                })
            })
            .collect();
        let mut out = ends.into_iter().map(|j| j.join().unwrap());
        [out.next().unwrap(), out.next().unwrap()]
    })
}

fn pair(mode: Protection, flip_at: Option<usize>) -> [SocketTransport; 2] {
    connect([mode; 2], flip_at).map(|(r, _)| r.expect("the ranks connect"))
}

/// Forwards one connection to `to`, flipping a bit of byte `flip_at` of the direction toward
/// `to`; returns the address to connect to.
fn relay(to: SocketAddr, flip_at: usize) -> SocketAddr {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        let (from, _) = l.accept().unwrap();
        let onward = TcpStream::connect(to).unwrap();
        let (from2, onward2) = (from.try_clone().unwrap(), onward.try_clone().unwrap());
        thread::spawn(move || pump(onward2, from2, None));
        pump(from, onward, Some(flip_at));
    });
    addr
}

fn pump(mut src: TcpStream, mut dst: TcpStream, flip_at: Option<usize>) {
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0;
    while let Ok(n) = src.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Some(f) = flip_at.filter(|f| (at..at + n).contains(f)) {
            buf[f - at] ^= 0x04;
        }
        at += n;
        if dst.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = dst.shutdown(Shutdown::Write);
}

/// Progresses `t` until every request of `reqs` finished; the first error.
fn wait(t: &mut SocketTransport, mut reqs: Vec<ReqId>) -> Result<(), TransportError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reqs.is_empty() {
        assert!(
            Instant::now() < deadline,
            "requests still pending after 60 s"
        );
        t.progress(Instant::now() + Duration::from_millis(5), false)?;
        let mut left = Vec::new();
        for r in reqs {
            if !t.test(r)? {
                left.push(r);
            }
        }
        reqs = left;
    }
    Ok(())
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(131) ^ seed) as u8)
        .collect()
}

/// Sends `sizes` to the other rank and receives the same sizes from it, all posted at once (every
/// third send confirmed); returns what arrived. Checks the send buffers were left alone.
fn exchange(t: &mut SocketTransport, sizes: &[usize]) -> Result<Vec<Vec<u8>>, TransportError> {
    let peer = 1 - t.rank();
    let mut sends: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &l)| pattern(l, t.rank() * 100 + i))
        .collect();
    let originals = sends.clone();
    let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&l| vec![0u8; l]).collect();
    let mut reqs = Vec::new();
    for (i, (s, r)) in sends.iter_mut().zip(recvs.iter_mut()).enumerate() {
        // SAFETY: the buffers outlive the requests (waited for below) and are not touched
        // until then.
        let (s, r) = unsafe { (Span::from_slice(s), Span::from_slice(r)) };
        let delivery = [Delivery::Confirmed, Delivery::Accepted, Delivery::Eager][i % 3];
        reqs.push(t.post_send(peer, s, OpTag::P2P, delivery)?);
        reqs.push(t.post_recv(peer, r, OpTag::P2P)?);
    }
    wait(t, reqs)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    // Acknowledgements the peer's sends wait for may still be queued behind a full socket.
    while t.unconfirmed()? || t.owes_output() {
        assert!(Instant::now() < deadline, "acknowledgements missing");
        t.progress(Instant::now() + Duration::from_millis(5), false)?;
    }
    assert_eq!(sends, originals, "a send buffer changed");
    Ok(recvs)
}

#[test]
fn messages_of_every_size_round_trip_in_both_modes() {
    let sizes = [
        0,
        1,
        3,
        4095,
        65_543,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        2 * CHUNK + 17,
        (5 << 20) + 3,
    ];
    for mode in MODES {
        let ends = pair(mode, None);
        // Each end lives until both finished: one closed early (with bytes it never read) would
        // reset the connection under the other's last acknowledgements.
        let got: Vec<_> = thread::scope(|s| {
            let joins: Vec<_> = ends
                .into_iter()
                .map(|mut t| s.spawn(move || (t.rank(), exchange(&mut t, &sizes), t)))
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        for (rank, recvs, _end) in got {
            let recvs = recvs.unwrap_or_else(|e| panic!("{mode}, rank {rank}: {e}"));
            for (i, r) in recvs.iter().enumerate() {
                let want = pattern(sizes[i], (1 - rank) * 100 + i);
                assert!(
                    *r == want,
                    "{mode}, rank {rank}: message {i} of {} B differs",
                    sizes[i]
                );
            }
        }
    }
}

/// What each rank saw when rank 0 sent 1000 bytes through a relay flipping byte `flip_at`:
/// rank 1's receive, and rank 0's receive of a reply that never comes.
fn tampered(mode: Protection, flip_at: usize) -> [Result<Vec<u8>, TransportError>; 2] {
    let [a, b] = pair(mode, Some(HANDSHAKE_OUT + flip_at));
    thread::scope(|s| {
        let sender = s.spawn(move || {
            let mut a = a;
            let mut msg = pattern(1000, 0);
            let mut reply = [0u8; 8];
            // SAFETY: both buffers outlive the requests (waited for here).
            let (m, r) = unsafe { (Span::from_slice(&mut msg), Span::from_slice(&mut reply)) };
            let reqs = vec![
                a.post_send(1, m, OpTag::P2P, Delivery::Eager)?,
                a.post_recv(1, r, OpTag::P2P)?,
            ];
            wait(&mut a, reqs).map(|()| reply.to_vec())
        });
        let receiver = s.spawn(move || {
            let mut b = b;
            let mut got = vec![0u8; 1000];
            // SAFETY: as above.
            let g = unsafe { Span::from_slice(&mut got) };
            let req = b.post_recv(0, g, OpTag::P2P)?;
            let r = wait(&mut b, vec![req]);
            if let Err(e) = &r {
                // What a communicator does with a failed operation.
                b.abort(&e.to_string());
            }
            r.map(|()| got)
        });
        [sender.join().unwrap(), receiver.join().unwrap()]
    })
}

#[test]
fn a_byte_flipped_on_the_wire_fails_the_receiver_naming_the_sender() {
    // Plain TCP takes the altered byte as data: the relay does flip it.
    let [_, plain] = tampered(Protection::None, 32 + 100);
    let plain = plain.expect("no check without protection");
    assert_eq!(
        plain
            .iter()
            .zip(pattern(1000, 0))
            .filter(|(a, b)| **a != *b)
            .count(),
        1
    );

    // In the header, its tag, the payload, the payload's tag.
    for mode in MODES {
        for at in [3, 40, 48 + 100, 48 + 1000 + 5] {
            let [sender, receiver] = tampered(mode, at);
            let e = receiver
                .expect_err("the altered frame is refused")
                .to_string();
            assert!(
                e.contains("integrity check failed") && e.contains("peer 0"),
                "{mode}, byte {at}: rank 1 says {e}"
            );
            let e = sender.expect_err("the sender fails too").to_string();
            assert!(e.contains("peer 1"), "{mode}, byte {at}: rank 0 says {e}");
        }
    }
}

/// Posts a receive of 4 bytes from the other rank for `tag` and waits for it; on failure,
/// aborts as a communicator does (telling the peer why).
fn recv_one(t: &mut SocketTransport, tag: OpTag) -> Result<(), TransportError> {
    let mut buf = [0u8; 4];
    // SAFETY: `buf` outlives the request (waited for here).
    let req = t.post_recv(1 - t.rank(), unsafe { Span::from_slice(&mut buf) }, tag)?;
    let r = wait(t, vec![req]);
    if let Err(e) = &r {
        t.abort(&e.to_string());
    }
    r
}

/// Acknowledgements and goodbyes are read on idle connections (peeked, checked, then taken):
/// `messages_of_every_size_round_trip_in_both_modes` confirms sends, this test says goodbye.
#[test]
fn probes_goodbyes_and_abort_notices_are_sealed_too() {
    for mode in MODES {
        // The ranks wait in different operations with one sequence number: a probe tells one
        // (or both), whose abort notice tells the other.
        let [mut a, mut b] = pair(mode, None);
        let (ea, eb) = thread::scope(|s| {
            let ea = s.spawn(|| recv_one(&mut a, OpTag { word: 0xa, seq: 5 }));
            let eb = s.spawn(|| recv_one(&mut b, OpTag { word: 0xb, seq: 5 }));
            (ea.join().unwrap(), eb.join().unwrap())
        });
        let mut found = 0;
        for (rank, e) in [(0, ea), (1, eb)] {
            let e = e.expect_err("the ranks disagree");
            found +=
                usize::from(matches!(e, TransportError::Disagree { peer, .. } if peer == 1 - rank));
            let told = format!("peer {} failed: peer {rank} runs", 1 - rank);
            assert!(
                matches!(e, TransportError::Disagree { .. }) || e.to_string().contains(&told),
                "{mode}, rank {rank}: {e}"
            );
        }
        assert!(found > 0, "{mode}: no rank read the other's probe");

        // A failing rank's reason reaches a rank waiting for it.
        let [mut a, mut b] = pair(mode, None);
        let e = thread::scope(|s| {
            let waiter = s.spawn(|| recv_one(&mut a, OpTag::P2P));
            thread::sleep(Duration::from_millis(100));
            b.abort("rank 1 gives up");
            waiter.join().unwrap()
        });
        let e = e.expect_err("rank 0 fails").to_string();
        assert!(e.contains("peer 1 failed: rank 1 gives up"), "{mode}: {e}");

        // A goodbye is the end of a finished peer, not a failure.
        let [mut a, mut b] = pair(mode, None);
        b.close();
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            a.probe_idle([1]).unwrap_or_else(|e| panic!("{mode}: {e}"));
            thread::sleep(Duration::from_millis(10));
        }
    }
}

#[test]
fn ranks_with_different_modes_both_fail_init_naming_the_cvar_and_both_modes() {
    for modes in [
        [Protection::Encrypt, Protection::None],
        [Protection::None, Protection::Integrity],
        [Protection::Integrity, Protection::Encrypt],
    ] {
        let outs = connect(modes, None);
        for (rank, (r, took)) in outs.iter().enumerate() {
            let e = r.as_ref().expect_err("init fails").to_string();
            let (me, other) = (modes[rank], modes[1 - rank]);
            let want = format!("rank {rank} uses {me}, rank {} uses {other}", 1 - rank);
            assert!(
                e.contains("TORCHCOMMS_DATA_PROTECTION differs") && e.contains(&want),
                "rank {rank}: {e}"
            );
            // At once, not at the 20 s deadline.
            assert!(*took < Duration::from_secs(5), "rank {rank} took {took:?}");
        }
    }
}
