//! One-sided operations of the TCP transport (windows): two ranks of one process over loopback,
//! plain and protected. Puts and signals land while the target has a two-sided receive posted
//! and while it has none; a put past the end of the region (a key that lies about its size) or
//! naming a stale generation is refused by the target without writing.

use std::net::Ipv4Addr;
use std::thread;
use std::time::{Duration, Instant};

use ctran::transport::socket::mesh::{connect_mesh, Listener, MeshPlan, SocketConfig};
use ctran::transport::socket::{Protection, SocketTransport};
use ctran::transport::{Delivery, OpTag, RemoteKey, SignalKind, Transport, TransportError};
use ctran::Span;

fn pair(protection: Protection) -> [SocketTransport; 2] {
    let listeners = [0, 1].map(|_| Listener::bind(Ipv4Addr::LOCALHOST.into()).unwrap());
    let addrs: Vec<_> = listeners.iter().map(Listener::addr).collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    thread::scope(|s| {
        let joins: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let plan = MeshPlan {
                    comm: "window".into(),
                    rank,
                    addrs: addrs.clone(),
                    key: [7; 32],
                    handshake_timeout: Duration::from_secs(10),
                    protection,
                    local_pids: Vec::new(),
                };
                s.spawn(move || connect_mesh(l, &plan, &SocketConfig::default(), deadline))
            })
            .collect();
        let mut out = joins.into_iter().map(|j| j.join().unwrap().unwrap());
        [out.next().unwrap(), out.next().unwrap()]
    })
}

/// Progresses both ends until `done` or 10 s.
fn drive(
    a: &mut SocketTransport,
    b: &mut SocketTransport,
    mut done: impl FnMut(&mut SocketTransport, &mut SocketTransport) -> bool,
) {
    let end = Instant::now() + Duration::from_secs(10);
    while !done(a, b) {
        assert!(Instant::now() < end, "nothing happened in 10 s");
        // Each end gets its own millisecond: one that sleeps in poll must not use up the
        // other's, or the other never reads what arrived while it idles.
        let _ = Transport::progress(a, Instant::now() + Duration::from_millis(1), false);
        let _ = Transport::progress(b, Instant::now() + Duration::from_millis(1), false);
    }
}

fn span(v: &mut [u8]) -> Span {
    // SAFETY: every buffer passed here outlives the transports' use of it in its test.
    unsafe { Span::from_slice(v) }
}

#[test]
fn puts_and_signals_land_amid_two_sided_traffic() {
    for mode in [Protection::None, Protection::Integrity, Protection::Encrypt] {
        let [mut a, mut b] = pair(mode);
        let mut window = vec![0u8; 3000];
        let (region, key) = b.register_region(span(&mut window), 42, None);
        let mut src: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        let mut msg = vec![9u8; 5000];
        let mut got = vec![0u8; 5000];
        // Target has a receive posted; the put, signal and message follow each other.
        let rx = Transport::post_recv(&mut b, 0, span(&mut got), OpTag::P2P).unwrap();
        let put = b_put(&mut a, &mut src, &key, 1000);
        let sig = Transport::post_signal(&mut a, 1, &key, SignalKind::Signal, 1).unwrap();
        let tx =
            Transport::post_send(&mut a, 1, span(&mut msg), OpTag::P2P, Delivery::Eager).unwrap();
        let mut left = vec![(0, put), (0, sig), (0, tx), (1, rx)];
        drive(&mut a, &mut b, |a, b| {
            left.retain(|&(who, r)| {
                let t = if who == 0 { &mut *a } else { &mut *b };
                !Transport::test(t, r).unwrap()
            });
            left.is_empty()
        });
        assert_eq!(got, msg, "{mode:?}");
        assert_eq!(&window[1000..2000], &src[..], "{mode:?}");
        assert!(window[..1000]
            .iter()
            .chain(&window[2000..])
            .all(|&x| x == 0));
        assert_eq!(b.region_counters(region, 0), Some((1, 0)));
        // No receive posted: the put and signal are read while the target idles.
        let mut src2 = vec![7u8; 64];
        let put = b_put(&mut a, &mut src2, &key, 0);
        Transport::post_signal(&mut a, 1, &key, SignalKind::Signal, 1).unwrap();
        let mut put_ended = false;
        drive(&mut a, &mut b, |a, b| {
            if !put_ended {
                put_ended = Transport::test(a, put).unwrap();
            }
            put_ended && b.region_counters(region, 0) == Some((2, 0))
        });
        assert_eq!(&window[..64], &src2[..], "{mode:?}");
    }
}

fn b_put(
    a: &mut SocketTransport,
    src: &mut [u8],
    key: &RemoteKey,
    off: u64,
) -> ctran::transport::ReqId {
    Transport::post_put(a, 1, span(src), key, off)
        .unwrap()
        .unwrap()
}

/// A put the target must refuse: the key lies about the size, or names another generation.
fn refused(lie: impl Fn(&mut RemoteKey), off: u64, bytes: usize, mode: Protection) -> String {
    let [mut a, mut b] = pair(mode);
    let mut window = vec![0u8; 100];
    let (region, mut key) = b.register_region(span(&mut window), 42, None);
    lie(&mut key);
    let mut src = vec![1u8; bytes];
    let put = Transport::post_put(&mut a, 1, span(&mut src), &key, off)
        .unwrap()
        .unwrap();
    let mut err = None;
    // A request is tested until it reports an end, never after (its id is gone then).
    let mut put_ended = false;
    drive(&mut a, &mut b, |a, b| {
        if !put_ended {
            put_ended = !matches!(Transport::test(a, put), Ok(false));
        }
        if let Err(e) = b.peer_alive(0) {
            err = Some(e);
        }
        err.is_some()
    });
    assert!(window.iter().all(|&x| x == 0), "nothing was written");
    assert_eq!(b.region_counters(region, 0), Some((0, 0)));
    // The sender learns why.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let _ = Transport::progress(&mut a, Instant::now() + Duration::from_millis(5), false);
        match a.peer_alive(1) {
            Err(TransportError::PeerLost { reason, .. }) => {
                assert!(reason.contains("refused a put"), "{reason}");
                break;
            }
            _ if Instant::now() > end => panic!("the sender never heard"),
            _ => {}
        }
    }
    err.unwrap().to_string()
}

#[test]
fn a_put_past_the_end_is_refused_by_the_target_without_writing() {
    for mode in [Protection::None, Protection::Integrity] {
        let e = refused(|k| k.len = 1 << 20, 50, 200, mode);
        assert!(
            e.contains("exceeds region") && e.contains("100 bytes"),
            "{e}"
        );
    }
}

#[test]
fn a_put_naming_a_stale_generation_is_refused() {
    let e = refused(|k| k.generation += 1, 0, 50, Protection::None);
    assert!(e.contains("stale generation"), "{e}");
    let e = refused(|k| k.id += 5, 0, 50, Protection::None);
    assert!(e.contains("not registered"), "{e}");
}

#[test]
fn the_sender_checks_the_key_too() {
    let [mut a, mut b] = pair(Protection::None);
    let mut window = vec![0u8; 10];
    let (_, key) = b.register_region(span(&mut window), 1, None);
    let mut src = vec![0u8; 11];
    let e = Transport::post_put(&mut a, 1, span(&mut src), &key, 0).unwrap_err();
    assert!(
        e.to_string().contains("exceeds the region of 10 bytes"),
        "{e}"
    );
}

/// A staged region's sink that records what it is told.
#[derive(Debug, Default)]
struct Ledger(std::sync::Mutex<Vec<(&'static str, usize, usize, usize)>>);

impl ctran::transport::RegionSink for Ledger {
    fn landed(&self, peer: usize, offset: usize, len: usize) {
        self.0.lock().unwrap().push(("put", peer, offset, len));
    }
    fn signalled(&self, peer: usize, add: u64) {
        self.0
            .lock()
            .unwrap()
            .push(("signal", peer, add as usize, 0));
    }
}

#[test]
fn a_staged_region_reports_each_put_before_the_signal_behind_it() {
    for mode in [Protection::None, Protection::Integrity, Protection::Encrypt] {
        let [mut a, mut b] = pair(mode);
        let mut staging = vec![0u8; 4096];
        let ledger = std::sync::Arc::new(Ledger::default());
        let sink: std::sync::Arc<dyn ctran::transport::RegionSink> = ledger.clone();
        let (region, key) = b.register_region(span(&mut staging), 42, Some(sink));
        assert!(key.staged, "the key tells peers to send frames");
        // With a receive posted (the put is read in its place), then with none.
        let mut got = vec![0u8; 16];
        let rx = Transport::post_recv(&mut b, 0, span(&mut got), OpTag::P2P).unwrap();
        let mut first: Vec<u8> = (0..1500).map(|i| (i % 249) as u8).collect();
        let mut second = vec![3u8; 100];
        let mut msg = vec![1u8; 16];
        b_put(&mut a, &mut first, &key, 100);
        Transport::post_signal(&mut a, 1, &key, SignalKind::Signal, 1).unwrap();
        let tx =
            Transport::post_send(&mut a, 1, span(&mut msg), OpTag::P2P, Delivery::Eager).unwrap();
        b_put(&mut a, &mut second, &key, 3000);
        Transport::post_signal(&mut a, 1, &key, SignalKind::Signal, 1).unwrap();
        let (mut tx_done, mut rx_done) = (false, false);
        drive(&mut a, &mut b, |a, b| {
            tx_done = tx_done || Transport::test(a, tx).unwrap();
            rx_done = rx_done || Transport::test(b, rx).unwrap();
            tx_done && rx_done && b.region_counters(region, 0) == Some((2, 0))
        });
        assert_eq!(got, msg, "{mode:?}");
        assert_eq!(&staging[100..1600], &first[..], "{mode:?}");
        assert_eq!(&staging[3000..3100], &second[..], "{mode:?}");
        assert_eq!(
            *ledger.0.lock().unwrap(),
            vec![
                ("put", 0, 100, 1500),
                ("signal", 0, 1, 0),
                ("put", 0, 3000, 100),
                ("signal", 0, 1, 0)
            ],
            "{mode:?}"
        );
    }
}
