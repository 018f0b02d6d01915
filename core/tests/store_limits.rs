//! The store server's limits against misbehaving clients, over real sockets: stalled large
//! SETs, a slow reader of large replies, many slowly sent requests and silent connections.
//! Each test measures what the limit protects (memory, other clients' latency) so that it
//! fails when the limit is missing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use torchcomms_core::bootstrap::tcp_store::{StoreLimits, TcpStoreClient, TcpStoreServer};
use torchcomms_core::bootstrap::Store;

const MIB: usize = 1 << 20;
const T: Duration = Duration::from_secs(20);

/// The tests measure the process's memory and a client's latency, so they run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn rss_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

fn bytes(v: &[u8]) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(v);
    b
}

/// A raw connection that sent VALIDATE.
fn raw(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[0, 0xce, 0xf7, 0x85, 0x3c]).unwrap();
    s
}

/// True when the server closed `s` within `within`.
fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

fn limits(max_value: usize, max_bytes: usize) -> StoreLimits {
    StoreLimits {
        max_value,
        max_bytes,
        ..StoreLimits::default()
    }
}

/// Ten clients announce 16 MiB values and stall after 15 MiB: the quota (64 MiB) admits three,
/// closes the others, and the server's memory stays near the quota; a value above the value
/// limit is refused at its header, and our client names the cvar.
#[test]
fn stalled_sets_past_the_quota_are_refused_and_memory_stays_bounded() {
    let _serial = one_at_a_time();
    let server = TcpStoreServer::bind_with("127.0.0.1", 0, limits(16 * MIB, 64 * MIB)).unwrap();
    let port = server.port();
    let before = rss_bytes();
    let chunk = vec![7u8; MIB];
    let mut conns = Vec::new();
    for i in 0..10 {
        let mut s = raw(port);
        let mut head = vec![1u8];
        head.extend(bytes(format!("/big{i}").as_bytes()));
        head.extend((16 * MIB as u64).to_le_bytes());
        s.write_all(&head).unwrap();
        // The server may close a refused one while we write: that is the point.
        for _ in 0..15 {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
        conns.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let grew = rss_bytes().saturating_sub(before);
    let closed = conns
        .iter_mut()
        .filter_map(|s| closed_within(s, Duration::from_millis(200)).then_some(()))
        .count();
    println!(
        "stalled SETs: {closed} of 10 closed, server memory grew {} MiB",
        grew / MIB
    );
    assert!(closed >= 6, "only {closed} of 10 stalled SETs were refused");
    // 150 MiB arrived in all; the quota keeps about 64 of it (plus the kernel's socket buffers,
    // which are not in RSS).
    assert!(grew < 100 * MIB, "server memory grew {} MiB", grew / MIB);

    let mut huge = raw(port);
    let mut head = vec![1u8];
    head.extend(bytes(b"/huge"));
    head.extend((100 * MIB as u64).to_le_bytes());
    huge.write_all(&head).unwrap();
    assert!(
        closed_within(&mut huge, Duration::from_secs(2)),
        "a value above the limit is refused at once"
    );

    drop(conns);
    let client = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    client.set("/small", b"ok").unwrap();
    assert_eq!(client.get("/small", T).unwrap(), b"ok");
    // Our client knows the limit of its configuration (the default, 64 MiB) and names it.
    let e = client
        .set("/too-big", &vec![0u8; 64 * MIB + 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("TORCHCOMMS_STORE_MAX_VALUE_BYTES"), "{e}");
}

/// A client pipelines 1000 GETs of a 512 KiB value (500 MiB of replies) and reads them more
/// slowly than the server writes: the server never holds much more than the client buffer's
/// worth of replies (written replies stayed in its buffer before: 1.8 GB behind a 64 MiB mark).
#[test]
fn a_slow_readers_reply_buffer_stays_bounded() {
    let _serial = one_at_a_time();
    let lim = StoreLimits {
        client_buffer: 4 * MIB,
        ..StoreLimits::default()
    };
    let server = TcpStoreServer::bind_with("127.0.0.1", 0, lim).unwrap();
    let port = server.port();
    let value = vec![9u8; 512 << 10];
    let n = 1000;
    let mut s = raw(port);
    s.set_read_timeout(Some(T)).unwrap();
    let mut set = vec![1u8];
    set.extend(bytes(b"/v"));
    set.extend(bytes(&value));
    s.write_all(&set).unwrap();
    let mut get = vec![3u8];
    get.extend(bytes(b"/v"));
    let all: Vec<u8> = get.iter().copied().cycle().take(get.len() * n).collect();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&all));
    let before = rss_bytes();
    let mut peak = 0;
    let total = n * (8 + value.len());
    let mut got = 0;
    let mut buf = vec![0u8; 256 << 10];
    let start = Instant::now();
    while got < total && start.elapsed() < Duration::from_secs(120) {
        let k = s.read(&mut buf).unwrap();
        assert!(k > 0, "server closed the slow reader");
        got += k;
        if got % (16 * MIB) < k {
            peak = peak.max(rss_bytes().saturating_sub(before));
        }
        // Slower than the server writes: its buffer never empties completely.
        std::thread::sleep(Duration::from_micros(500));
    }
    writer.join().unwrap().unwrap();
    println!(
        "slow reader: {} MiB of replies, server memory peak +{} MiB",
        got / MIB,
        peak / MIB
    );
    assert_eq!(got, total);
    assert!(
        peak < 64 * MIB,
        "memory grew {} MiB behind a 4 MiB client buffer",
        peak / MIB
    );
}

/// Twenty clients each send a MULTI_SET of 20000 pairs a few pairs at a time; another client's
/// 200 round trips still finish in seconds. When every wake-up decoded each pending request
/// from its start, a single round trip took seconds, so the bound separates the two designs by
/// orders of magnitude and does not depend on how busy the machine is.
#[test]
fn many_slow_partial_requests_do_not_slow_other_clients() {
    let _serial = one_at_a_time();
    let server = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
    let port = server.port();
    let client = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    let round_trips = |n: usize| {
        let start = Instant::now();
        for i in 0..n {
            client.set(&format!("/k{i}"), b"v").unwrap();
            client.get(&format!("/k{i}"), T).unwrap();
        }
        start.elapsed()
    };
    round_trips(50);
    let alone = round_trips(200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow: Vec<_> = (0..20)
        .map(|c| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut s = raw(port);
                let mut head = vec![11u8];
                head.extend(20000u64.to_le_bytes());
                s.write_all(&head).unwrap();
                let mut sent = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 20000 {
                    let mut pair = bytes(format!("/slow{c}/{sent}").as_bytes());
                    pair.extend(bytes(&[1u8; 16]));
                    s.write_all(&pair).unwrap();
                    sent += 1;
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let loaded = round_trips(200);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in slow {
        t.join().unwrap();
    }
    println!("200 set+get: alone {alone:?}, beside 20 slow requests {loaded:?}");
    assert!(
        loaded < Duration::from_secs(20),
        "200 round trips took {loaded:?} beside 20 slow requests (alone {alone:?})"
    );
}

/// A hundred connections that never send VALIDATE do not stop clients, and are closed after
/// the handshake timeout.
#[test]
fn silent_connections_are_closed_after_the_handshake_timeout() {
    let _serial = one_at_a_time();
    let lim = StoreLimits {
        handshake_timeout: Duration::from_secs(4),
        ..StoreLimits::default()
    };
    let server = TcpStoreServer::bind_with("127.0.0.1", 0, lim).unwrap();
    let port = server.port();
    let mut silent: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let start = Instant::now();
    let client = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    client.set("/a", b"1").unwrap();
    assert_eq!(client.get("/a", T).unwrap(), b"1");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "a client waited {:?} behind silent connections that time out after 4 s",
        start.elapsed()
    );
    let closed = silent
        .iter_mut()
        .filter_map(|s| closed_within(s, Duration::from_secs(8)).then_some(()))
        .count();
    assert_eq!(
        closed, 100,
        "silent connections still open after the timeout"
    );
}
