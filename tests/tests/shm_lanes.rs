//! Shared-memory collectives cut into lanes (`CTRAN_SHM_LANES`), each run by a thread of its
//! own: every operation at every size, a killed rank, and ranks that disagree about a size (so
//! that some cut the operation and others do not).

use std::path::PathBuf;
use std::time::Duration;

use torchcomms_tests::faults::{self, assert_survivors_failed};
use torchcomms_tests::{assert_all_ok, Job, RankOutput};

fn worker() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tc-worker"))
}

/// Operations a suite rank ran cut into lanes, from its `LANES rank` line.
fn laned(o: &RankOutput) -> u64 {
    o.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("LANES rank {}: ", o.rank)))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("rank {} did not report its lanes: {}", o.rank, o.stdout))
}

/// The suite (every collective, odd sizes, every dtype the suite covers) with every shared-memory
/// collective cut into `lanes` lanes, whatever its size.
fn suite_on_lanes(n: usize, lanes: usize, cma: bool) {
    let outs = Job::new(n, &["suite", "--large", &(1 << 20).to_string()])
        .env("CTRAN_BACKENDS", "socket,shm")
        .env("CTRAN_SHM_LANES", &lanes.to_string())
        .env("CTRAN_SHM_LANES_MIN_BYTES", "0")
        .env("CTRAN_SHM_CMA", if cma { "1" } else { "0" })
        .env("CTRAN_SHM_CMA_MIN_BYTES", "0")
        .run(&worker());
    let what = format!("suite with {n} ranks on {lanes} lanes (cma {cma})");
    assert_all_ok(&outs, &what);
    assert_eq!(outs.len(), n);
    for o in &outs {
        assert!(
            o.stdout.contains(&format!("SUITE OK rank {}/{n}", o.rank)),
            "{what}: rank {} printed: {}",
            o.rank,
            o.stdout
        );
        assert!(laned(o) > 0, "{what}: rank {} ran nothing on lanes", o.rank);
    }
}

#[test]
fn suite_2_ranks_on_3_lanes_with_cma() {
    suite_on_lanes(2, 3, true);
}

#[test]
fn suite_3_ranks_on_2_lanes() {
    suite_on_lanes(3, 2, false);
}

#[test]
fn suite_4_ranks_on_2_lanes_with_cma() {
    suite_on_lanes(4, 2, true);
}

/// A rank killed in the middle of an all_reduce cut into lanes: every survivor fails within the
/// timeout (its helper lanes stop too), naming the operation and the peer.
#[test]
fn killed_rank_during_laned_all_reduce_fails_every_survivor() {
    let outs = faults::job(3, "kill-allreduce", 1)
        .env("CTRAN_BACKENDS", "socket,shm")
        .env("CTRAN_SHM_LANES", "3")
        .run(&worker());
    assert_survivors_failed(&outs, 1, "all_reduce", Some(4), "peer 1");
}

/// A rank killed in the middle of an all_to_all cut into lanes (with more than two ranks on
/// lanes, all_to_all copies through the shared buffers): every survivor fails within the
/// timeout, naming the operation and the peer.
#[test]
fn killed_rank_during_laned_all_to_all_fails_every_survivor() {
    let outs = faults::job(3, "kill-alltoall", 1)
        .env("CTRAN_BACKENDS", "socket,shm")
        .env("CTRAN_SHM_LANES", "2")
        .env("CTRAN_SHM_LANES_MIN_BYTES", "1M")
        .run(&worker());
    assert_survivors_failed(&outs, 1, "all_to_all", Some(4), "peer 1");
}

/// Ranks that disagree about a collective's size all fail at once naming the mismatch, also
/// when rank 0's smaller size falls under the lanes threshold and the others' over it (rank 0
/// runs the operation on one lane, the others cut it).
#[test]
fn size_mismatch_across_the_lanes_threshold_fails_every_rank() {
    // The threshold straddled: all_reduce mixed has 1.5 MiB on rank 0 and 3 MiB elsewhere
    // (reductions are cut from a quarter of it, 2 MiB); all_gather small gathers 3 KiB on
    // rank 0 and 6 KiB elsewhere. reduce_scatter large: every rank cuts, into parts that differ.
    for (op, size, min) in [
        ("all_reduce", "mixed", "8M"),
        ("all_gather", "small", "5K"),
        ("reduce_scatter", "large", "2M"),
    ] {
        let mut job = Job::new(3, &["mismatch", "--op", op, "--size", size])
            .env("CTRAN_BACKENDS", "socket,shm")
            .env("CTRAN_SHM_LANES", "2")
            .env("CTRAN_SHM_LANES_MIN_BYTES", min)
            .env("TORCHCOMM_TIMEOUT_SECONDS", "30");
        job.timeout = Duration::from_secs(60);
        let outs = job.run(&worker());
        assert_eq!(outs.len(), 3);
        faults::assert_every_rank_named_mismatch(&outs, op, &format!("{op} {size} on lanes"));
    }
}
