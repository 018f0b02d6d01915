//! Set-up under attack, with ranks as processes over real sockets: silent connections to
//! every listener, a rank with another job key, and an intruder that knows only MASTER_PORT.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ctran::bootstrap::auth::JobKey;
use ctran::bootstrap::tcp_store::{TcpStoreClient, TcpStoreServer};
use ctran::bootstrap::Store;
use torchcomms_tests::{assert_all_ok, collect, Job};

const KEY: &str = "hardening-test-key";
const T: Duration = Duration::from_secs(20);

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tc-worker"))
}

/// A job of `n` ranks running `simple` against a store the test serves (torchrun's agent
/// store), so the test can read the store and reach the ranks before the job completes.
fn job(n: usize, key: &str) -> Job {
    let mut job = Job::new(n, &["simple"])
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .env("TORCHCOMMS_JOB_KEY", key);
    job.timeout = Duration::from_secs(90);
    job
}

/// The address rank `r` published.
fn rank_addr(client: &TcpStoreClient, r: usize) -> String {
    let raw = client
        .get(&format!("torchcomms/simple/1/addr/{r}"), T)
        .expect("the rank publishes its address");
    String::from_utf8(raw).unwrap()
}

/// 100 silent sockets to the store and to every rank that accepts connections: the job forms
/// in a time unrelated to their number (each cost 2 s before, 70 failed init).
#[test]
fn silent_sockets_to_every_listener_do_not_stop_init() {
    let server = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
    let port = server.port();
    let mut silent: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let job = job(3, KEY);
    // Ranks 1 and 2 start first: they publish their addresses, then wait for rank 0's nonce.
    let others: Vec<_> = (1..3)
        .map(|r| (r, job.spawn_rank(&worker(), r, port)))
        .collect();
    let client = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    for r in 1..3 {
        let addr = rank_addr(&client, r);
        silent.extend((0..100).map(|_| TcpStream::connect(&addr).unwrap()));
    }
    let start = Instant::now();
    let mut children = vec![(0, job.spawn_rank(&worker(), 0, port))];
    children.extend(others);
    let outs = collect(children, job.timeout);
    let took = start.elapsed();
    assert_all_ok(&outs, "job beside 300 silent sockets");
    println!("3-rank init and all_reduce beside 300 silent sockets: {took:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    drop(silent);
}

/// Rank 1 holds another job key: rank 0 fails at once naming the key, rank 1 fails once rank
/// 0 has exited (or at its timeout) naming the refused proof; neither hangs.
#[test]
fn a_rank_with_another_job_key_fails_every_rank_within_the_timeout() {
    let server = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
    let port = server.port();
    let good = job(2, KEY).env("TORCHCOMM_TIMEOUT_SECONDS", "15");
    let bad = job(2, "another-key").env("TORCHCOMM_TIMEOUT_SECONDS", "15");
    let children = vec![
        (0, good.spawn_rank(&worker(), 0, port)),
        (1, bad.spawn_rank(&worker(), 1, port)),
    ];
    let outs = collect(children, good.timeout);
    for o in &outs {
        assert!(!o.ok(), "rank {} succeeded with mismatched keys", o.rank);
        assert!(o.status.is_some(), "rank {} hung until killed", o.rank);
        assert!(
            o.elapsed < Duration::from_secs(40),
            "rank {} took {:?}",
            o.rank,
            o.elapsed
        );
    }
    let err = |r: usize| outs.iter().find(|o| o.rank == r).unwrap().stderr.clone();
    assert!(
        err(0).contains("did not prove it holds this job's key")
            && err(0).contains("TORCHCOMMS_JOB_KEY"),
        "rank 0: {}",
        err(0)
    );
    assert!(
        err(1).contains("did not connect") && err(1).contains("proving the job key"),
        "rank 1: {}",
        err(1)
    );
}

/// An intruder that knows MASTER_PORT reads everything a rank publishes, yet neither finds the
/// communicator's secret nor gets through a rank's handshake; the job completes.
#[test]
fn an_intruder_with_only_master_port_gets_no_secret_and_no_connection() {
    let server = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
    let port = server.port();
    let job = job(2, KEY);
    let rank1 = job.spawn_rank(&worker(), 1, port);
    let intruder = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
    let addr = rank_addr(&intruder, 1);
    // No secret in the store, in the clear or otherwise (the old key was `secret`).
    assert!(!intruder.check(&["torchcomms/simple/1/secret"]).unwrap());

    // A well-formed HELLO claiming rank 0, then a proof made without the job key.
    let mut s = TcpStream::connect(&addr).unwrap();
    let intruder_addr = s.local_addr().unwrap().to_string();
    s.set_read_timeout(Some(T)).unwrap();
    let mut hello = [0u8; 64];
    hello[..8].copy_from_slice(b"TCRSHEL3");
    hello[8..12].copy_from_slice(&3u32.to_le_bytes());
    hello[16..20].copy_from_slice(&1u32.to_le_bytes());
    s.write_all(&hello).unwrap();
    let mut garbage = TcpStream::connect(&addr).unwrap();
    let garbage_addr = garbage.local_addr().unwrap().to_string();
    garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    // Rank 1 answers handshakes once rank 0 published the communicator's nonce.
    let rank0 = job.spawn_rank(&worker(), 0, port);
    let mut challenge = [0u8; 68];
    s.read_exact(&mut challenge)
        .expect("rank 1 challenges a well-formed hello");
    s.write_all(&[0u8; 32]).unwrap();
    let mut ack = [0u8; 1];
    assert!(
        matches!(s.read(&mut ack), Ok(0) | Err(_)),
        "rank 1 accepted a connection without the job key"
    );

    let outs = collect(vec![(0, rank0), (1, rank1)], job.timeout);
    assert_all_ok(&outs, "job with an intruder");
    let log = &outs.iter().find(|o| o.rank == 1).unwrap().stderr;
    // Refused for its proof, or (if rank 0 finished the mesh first) for still handshaking.
    assert!(
        log.contains(&format!("refused connection from {intruder_addr}")),
        "rank 1: {log}"
    );
    assert!(
        log.contains(&format!("refused connection from {garbage_addr}")),
        "rank 1 should name the garbage connection {garbage_addr}: {log}"
    );

    // Everything the job stored, read by the intruder: none of it is (or holds) the secret.
    let nonce = intruder.get("torchcomms/simple/1/nonce", T).unwrap();
    let secret = JobKey::from_bytes(KEY.as_bytes()).comm_secret("torchcomms/simple/1", &nonce);
    for key in ["nonce", "addr/0", "addr/1", "host/0", "host/1"] {
        let v = intruder
            .get(&format!("torchcomms/simple/1/{key}"), T)
            .unwrap();
        assert!(
            !v.windows(16).any(|w| w == &secret[..16]),
            "{key} holds the communicator secret"
        );
    }
}
