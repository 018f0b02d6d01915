//! A rank killed while its communicator is being set up (after every rank published its host
//! record: the TCP mesh, shared memory, the first barrier), with ranks as processes on one host:
//! the survivors fail within seconds, not at the init deadline (120 s here), and nothing is
//! left in /dev/shm.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ctran::bootstrap::tcp_store::{TcpStoreClient, TcpStoreServer};
use ctran::bootstrap::Store;
use torchcomms_tests::{collect, Job};

const T: Duration = Duration::from_secs(20);

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tc-worker"))
}

fn our_segments() -> HashSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tcrs-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_rank_killed_during_set_up_fails_the_others_in_seconds_and_leaves_no_segment() {
    let before = our_segments();
    // The creator of the segment (rank 0) and another rank, at several points of set-up.
    for (victim, delay_ms) in [(0, 0), (0, 5), (0, 20), (1, 0), (1, 10), (0, 60), (2, 30)] {
        let server = TcpStoreServer::bind("127.0.0.1", 0).expect("store server");
        let port = server.port();
        let mut job = Job::new(4, &["simple"])
            .env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("TORCHCOMM_TIMEOUT_SECONDS", "120");
        job.timeout = Duration::from_secs(60);
        let mut children: Vec<_> = (0..4)
            .map(|r| (r, job.spawn_rank(&worker(), r, port)))
            .collect();
        let client = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
        for r in 0..4 {
            client
                .get(&format!("torchcomms/simple/1/host/{r}"), T)
                .expect("every rank publishes its host record");
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let killed_at = Instant::now();
        children[victim].1.kill().expect("kill the victim");
        let outs = collect(children, job.timeout);
        let took = killed_at.elapsed();
        let what = format!("rank {victim} killed {delay_ms} ms into set-up");
        for o in outs.iter().filter(|o| o.rank != victim) {
            // A survivor ends by itself (with an error, or done if set-up had finished and the
            // victim's part of the all-reduce was already in), never by the test's timeout.
            assert!(
                o.status.is_some_and(|s| s.code().is_some()),
                "{what}: rank {} did not end by itself: {:?}\n{}",
                o.rank,
                o.status,
                o.stderr
            );
        }
        assert!(
            took < Duration::from_secs(20),
            "{what}: the survivors took {took:?} to end"
        );
        let left: Vec<_> = our_segments().difference(&before).cloned().collect();
        assert!(
            left.is_empty(),
            "{what}: left in /dev/shm: {left:?}\n{}",
            outs.iter()
                .map(|o| format!("--- rank {}: {:?}\n{}", o.rank, o.status, o.stderr))
                .collect::<String>()
        );
        eprintln!("{what}: survivors ended after {took:?}");
    }
}
