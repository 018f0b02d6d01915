//! `TORCHCOMMS_DATA_PROTECTION` with ranks as processes over TCP on loopback: every collective
//! in both protected modes, ranks that disagree about the mode, and a relay that flips one byte
//! between two ranks of a running job.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use ctran::bootstrap::tcp_store::{TcpStoreClient, TcpStoreServer};
use ctran::bootstrap::Store;
use torchcomms_tests::{assert_all_ok, collect, free_port, Job, RankOutput};

const CVAR: &str = "TORCHCOMMS_DATA_PROTECTION";
const T: Duration = Duration::from_secs(20);

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tc-worker"))
}

/// The worker's suite (every collective, sizes up to `large` bytes) between `n` processes over
/// TCP only, protected by `mode`.
fn suite(n: usize, large: usize, mode: &str) {
    let outs = Job::new(n, &["suite", "--large", &large.to_string()])
        .env("CTRAN_BACKENDS", "socket")
        .env(CVAR, mode)
        .run(&worker());
    assert_all_ok(&outs, &format!("suite with {n} ranks, {mode}"));
    assert_eq!(outs.len(), n);
    for o in &outs {
        assert!(
            o.stdout.contains(&format!("SUITE OK rank {}/{n}", o.rank)),
            "rank {} printed: {}",
            o.rank,
            o.stdout
        );
    }
}

#[test]
fn suite_3_processes_encrypt() {
    // Above two 256 KiB records per message, not a multiple of one.
    suite(3, (3 << 20) + 5, "encrypt");
}

#[test]
fn suite_4_processes_integrity() {
    suite(4, (1 << 20) + 5, "integrity");
}

fn err_of(outs: &[RankOutput], rank: usize) -> &str {
    &outs
        .iter()
        .find(|o| o.rank == rank)
        .expect("rank ran")
        .stderr
}

/// Every rank failed by itself (none killed at the job timeout) within `limit`.
fn assert_all_failed(outs: &[RankOutput], limit: Duration, what: &str) {
    assert!(!outs.is_empty(), "{what}: no rank ran");
    for o in outs {
        assert!(!o.ok(), "{what}: rank {} succeeded", o.rank);
        assert!(
            o.status.is_some(),
            "{what}: rank {} hung until killed",
            o.rank
        );
        assert!(
            o.elapsed < limit,
            "{what}: rank {} took {:?}",
            o.rank,
            o.elapsed
        );
    }
}

#[test]
fn mismatched_modes_fail_init_on_both_ranks_naming_the_cvar_and_both_values() {
    let port = free_port();
    let job = |mode: &str| {
        let mut j = Job::new(2, &["simple"])
            .env(CVAR, mode)
            .env("TORCHCOMM_TIMEOUT_SECONDS", "30");
        j.timeout = Duration::from_secs(90);
        j
    };
    let children = vec![
        (0, job("encrypt").spawn_rank(&worker(), 0, port)),
        (1, job("none").spawn_rank(&worker(), 1, port)),
    ];
    let outs = collect(children, Duration::from_secs(90));
    // At once: well before the 30 s init timeout.
    assert_all_failed(&outs, Duration::from_secs(20), "mismatched modes");
    for (rank, want) in [
        (0, "rank 0 uses encrypt, rank 1 uses none"),
        (1, "rank 1 uses none, rank 0 uses encrypt"),
    ] {
        let e = err_of(&outs, rank);
        assert!(
            e.contains(&format!("{CVAR} differs between ranks")) && e.contains(want),
            "rank {rank}: {e}"
        );
    }
}

/// Forwards one connection to `to`, flipping a bit of byte `flip_at` of what the connecting
/// side sends; returns the relay's address.
fn relay(to: String, flip_at: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let Ok((from, _)) = l.accept() else { return };
        let onward = TcpStream::connect(&to).unwrap();
        let (from2, onward2) = (from.try_clone().unwrap(), onward.try_clone().unwrap());
        std::thread::spawn(move || pump(onward2, from2, None));
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

/// Rank 0 reaches rank 1 through a relay (the test rewrites rank 1's address in the store
/// before rank 0 reads it) that flips one bit of rank 0's first frame. Rank 1 finds it and
/// names it; its failure reaches every other rank, and no rank hangs.
#[test]
fn a_byte_flipped_between_two_ranks_fails_every_rank() {
    for mode in ["integrity", "encrypt"] {
        let server = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
        let port = server.port();
        let mut job = Job::new(3, &["simple"])
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("CTRAN_BACKENDS", "socket")
            .env("TORCHCOMM_TIMEOUT_SECONDS", "30")
            .env(CVAR, mode);
        job.timeout = Duration::from_secs(90);
        // Ranks 1 and 2 publish their addresses, then wait for rank 0's nonce.
        let mut children: Vec<_> = (1..3)
            .map(|r| (r, job.spawn_rank(&worker(), r, port)))
            .collect();
        let store = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
        let key = "torchcomms/simple/1/addr/1";
        let real = String::from_utf8(store.get(key, T).expect("rank 1 publishes")).unwrap();
        // After HELLO (64 bytes) and the proof (32): a byte of the first frame's header.
        let via = relay(real, 64 + 32 + 3);
        store.set(key, via.as_bytes()).unwrap();
        children.push((0, job.spawn_rank(&worker(), 0, port)));
        let outs = collect(children, job.timeout);
        assert_all_failed(&outs, Duration::from_secs(25), mode);
        let e1 = err_of(&outs, 1);
        assert!(
            e1.contains("lost peer 0: integrity check failed"),
            "{mode}, rank 1: {e1}"
        );
        // Rank 2 learns why through rank 1's abort notice; rank 0, whose connection rank 1
        // shut, through rank 2's notice or from the closed connection.
        let e2 = err_of(&outs, 2);
        assert!(
            e2.contains("peer 1 failed: ") && e2.contains("integrity check failed"),
            "{mode}, rank 2: {e2}"
        );
        let e0 = err_of(&outs, 0);
        assert!(
            e0.contains("integrity check failed") || e0.contains("lost peer 1"),
            "{mode}, rank 0: {e0}"
        );
        drop(server);
    }
}
