//! One-sided windows with ranks as separate processes over real TCP on loopback, and with
//! shared memory (cross-memory attach) between them: every window call on 2, 3 and 5 ranks, a
//! ring of 1,000 put + signal / wait_signal iterations checked each time, disjoint slots, and
//! bad input (see `tc-worker window`).

use std::path::PathBuf;
use std::time::Duration;

use torchcomms_tests::{assert_all_ok, Job};

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tc-worker"))
}

fn window_job(n: usize, backends: &str, protection: &str) {
    let mut job = Job::new(n, &["window", "--iters", "1000"])
        .env("CTRAN_BACKENDS", backends)
        .env("TORCHCOMMS_DATA_PROTECTION", protection)
        .env("TORCHCOMM_TIMEOUT_SECONDS", "30");
    job.timeout = Duration::from_secs(120);
    let outs = job.run(&worker());
    let what = format!("window on {n} ranks over {backends} ({protection})");
    assert_all_ok(&outs, &what);
    assert_eq!(outs.len(), n);
    for o in &outs {
        assert!(
            o.stdout.contains(&format!("WINDOW OK rank {}/{n}", o.rank)),
            "{what}: rank {} printed {}",
            o.rank,
            o.stdout
        );
        if backends == "socket" {
            assert!(
                o.stdout.contains("WINDOW CMA PUTS 0"),
                "{what}: {}",
                o.stdout
            );
        }
        assert!(
            o.stdout.contains("registered") && o.stdout.contains("bytes"),
            "{what}: the size error names the sizes: {}",
            o.stdout
        );
    }
}

#[test]
fn windows_on_2_ranks() {
    window_job(2, "socket", "none");
    window_job(2, "socket,shm", "none");
    // Naming ib changes nothing yet: communicators keep socket (and shm) routes.
    window_job(2, "socket,shm,ib", "none");
}

#[test]
fn windows_on_3_ranks() {
    window_job(3, "socket", "none");
    window_job(3, "socket,shm", "none");
}

#[test]
fn windows_on_5_ranks() {
    window_job(5, "socket", "none");
    window_job(5, "socket,shm", "none");
}

#[test]
fn windows_over_protected_connections() {
    window_job(3, "socket", "encrypt");
}
