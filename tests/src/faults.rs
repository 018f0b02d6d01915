//! Fault jobs: ranks of which one is killed or stalls, and the checks that every survivor failed
//! in time, naming the operation and the peer.

use std::time::Duration;

use crate::{Job, RankOutput};

/// The timeout fault jobs run with, in seconds.
pub const FAULT_TIMEOUT_S: u64 = 6;

/// A job of `n` ranks running the worker's fault `scenario` against `victim`, with the fault
/// timeout (add the backends and run it).
pub fn job(n: usize, scenario: &str, victim: usize) -> Job {
    let mut job = Job::new(n, &[scenario, "--victim", &victim.to_string()])
        .env("TORCHCOMM_TIMEOUT_SECONDS", &FAULT_TIMEOUT_S.to_string());
    // A stalled rank never exits by itself; the harness kills it.
    job.timeout = Duration::from_secs(FAULT_TIMEOUT_S * 3);
    job
}

/// Every survivor reported an error naming the op and sequence number (init ran two barriers and
/// the scenario one warm-up all_reduce first) within timeout + 2 s,
/// and the communicator refused work afterwards.
pub fn assert_survivors_failed(
    outs: &[RankOutput],
    victim: usize,
    op: &str,
    seq: Option<u64>,
    must_name: &str,
) {
    let limit = Duration::from_secs(FAULT_TIMEOUT_S + 2);
    let mut survivors = 0;
    for o in outs.iter().filter(|o| o.rank != victim) {
        if o.stdout.contains("BYSTANDER") {
            continue;
        }
        survivors += 1;
        assert!(
            o.ok(),
            "rank {} exited {:?}:\n{}\n{}",
            o.rank,
            o.status,
            o.stdout,
            o.stderr
        );
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with("SURVIVOR"))
            .unwrap_or_else(|| panic!("rank {} did not report: {}", o.rank, o.stdout));
        let named = match seq {
            Some(seq) => format!("{op} (seq {seq})"),
            None => format!("{op} (seq "),
        };
        assert!(line.contains(&named), "rank {}: {line}", o.rank);
        assert!(
            line.contains(must_name),
            "rank {} should name {must_name:?}: {line}",
            o.rank
        );
        let ms: u64 = line
            .split_whitespace()
            .nth(4)
            .and_then(|s| s.parse().ok())
            .expect("elapsed ms");
        assert!(
            Duration::from_millis(ms) < limit,
            "rank {} took {ms} ms",
            o.rank
        );
        assert!(
            o.elapsed < limit + Duration::from_secs(5),
            "rank {} exited after {:?}",
            o.rank,
            o.elapsed
        );
        assert!(
            o.stdout.contains(&format!("REFUSED rank {}", o.rank)),
            "rank {} accepted work after failing",
            o.rank
        );
    }
    assert!(survivors > 0, "no survivor reported");
}

/// Every rank of a job whose ranks disagree about `op`'s size failed at once (well within the
/// job's 30 s timeout) with an error naming the mismatch; `case` names the job in failures.
pub fn assert_every_rank_named_mismatch(outs: &[RankOutput], op: &str, case: &str) {
    crate::assert_all_ok(outs, &format!("{case} mismatch"));
    assert_every_rank_detected(outs, "MISMATCH", "mismatch", case, |line| {
        line.contains("mismatch with peer") && line.contains(op)
    });
}

/// Every rank printed a `{marker} rank R` line that `names_it` accepts (its error names the
/// `what`: a mismatch, a disagreement) within 20 s, well inside the job's 30 s timeout, so the
/// failure was detected, not timed out; `case` names the job in failures.
pub fn assert_every_rank_detected(
    outs: &[RankOutput],
    marker: &str,
    what: &str,
    case: &str,
    names_it: impl Fn(&str) -> bool,
) {
    for o in outs {
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{marker} rank {}", o.rank)))
            .unwrap_or_else(|| panic!("{case}: rank {} printed {}", o.rank, o.stdout));
        assert!(
            names_it(line),
            "{case}: rank {} did not name the {what}: {line}",
            o.rank
        );
        assert!(
            o.elapsed < Duration::from_secs(20),
            "{case}: rank {} took {:?} (a timeout, not a detected {what})",
            o.rank,
            o.elapsed
        );
    }
}
