//! The verdict on one communicator, in named steps: membership, progress, mismatches, ranks
//! behind, stuck operations, point-to-point, missing ranks, slowness, and the status.
//!
//! Each step appends its findings to the list in the order a reader wants them (mismatches
//! first; a rank that never joined, when it explains a failed creation, goes to the top).

use std::collections::{BTreeMap, BTreeSet};

use colltrace::schema::{CommState, RecordKind, State};

use super::report::{Behind, CommVerdict, Mismatch, MismatchGroup, OpBrief, RankProgress, Slowest};
use super::signature::Signature;
use super::timing::{arrival_skew, timeline};
use super::{collectives, ranks_text, Member, Options};

/// The calls of every rank at each sequence number (started records only).
type CallsBySeq = BTreeMap<u64, Vec<(usize, Signature)>>;

/// Members of the communicator that are absent or not connected yet.
struct Membership {
    /// Dumped, but with no record of this communicator.
    never_joined: Vec<usize>,
    /// No dump at all.
    no_dump: Vec<usize>,
    /// Still connecting.
    joining: Vec<usize>,
}

/// What the stuck, failed and timed-out operations found.
#[derive(Default)]
struct Trouble {
    /// An operation ran past the hang threshold.
    hung: bool,
    /// An operation failed or timed out, or the communicator failed or was aborted.
    failed: bool,
}

pub(super) fn analyze_comm(
    name: &str,
    instance: u64,
    members: &[Member],
    dumped: &BTreeSet<usize>,
    opts: &Options,
) -> CommVerdict {
    let first = members[0].comm;
    let size = first.size;
    let global_ranks = first.global_ranks.clone();
    let mut findings = Vec::new();

    let membership = membership(&global_ranks, members, dumped);
    let progress = progress(members);
    let completed_by_all = progress.iter().map(|p| p.completed).min().unwrap_or(0);
    let started_by_all = progress.iter().map(|p| p.started).min().unwrap_or(0);
    let started_by_any = progress.iter().map(|p| p.started).max().unwrap_or(0);

    let by_seq = calls_by_seq(members);
    let mismatches = mismatches(&by_seq, &mut findings);
    let behind = behind(members, &progress, &by_seq, started_by_any, &mut findings);
    let mut trouble = stuck(&progress, opts, &mut findings);
    let p2p_pending = p2p(members, &global_ranks, &mut trouble, &mut findings);
    if members
        .iter()
        .any(|m| matches!(m.comm.state, CommState::Failed | CommState::Aborted))
    {
        trouble.failed = true;
    }
    missing_findings(members, &membership, &mut findings);
    let slowest = arrival_skew(members, opts);
    slow_findings(&slowest, &mut findings);

    let status = status(
        &mismatches,
        &trouble,
        &membership,
        &behind,
        &progress,
        &p2p_pending,
    );
    if findings.is_empty() && status == "ok" {
        findings.push(format!(
            "healthy: every rank completed seq {completed_by_all}"
        ));
    }

    CommVerdict {
        name: name.into(),
        instance,
        size,
        global_ranks,
        status: status.into(),
        findings,
        completed_by_all,
        started_by_all,
        started_by_any,
        progress,
        behind,
        mismatches,
        never_joined: membership.never_joined,
        no_dump: membership.no_dump,
        joining: membership.joining,
        p2p_pending,
        slowest,
        timeline: timeline(members),
    }
}

/// Ranks that never joined, left no dump, or are still joining.
fn membership(global_ranks: &[usize], members: &[Member], dumped: &BTreeSet<usize>) -> Membership {
    let present: Vec<usize> = members.iter().map(|m| m.rank).collect();
    let never_joined: Vec<usize> = global_ranks
        .iter()
        .copied()
        .filter(|r| !present.contains(r) && dumped.contains(r))
        .collect();
    let no_dump: Vec<usize> = global_ranks
        .iter()
        .copied()
        .filter(|r| !present.contains(r) && !dumped.contains(r))
        .collect();
    let joining: Vec<usize> = members
        .iter()
        .filter(|m| m.comm.state == CommState::Joining)
        .map(|m| m.rank)
        .collect();
    Membership {
        never_joined,
        no_dump,
        joining,
    }
}

/// Progress per rank.
fn progress(members: &[Member]) -> Vec<RankProgress> {
    members
        .iter()
        .map(|m| {
            let c = m.comm;
            let current = c
                .records
                .iter()
                .find(|r| r.kind != RecordKind::P2p && r.state != State::Completed)
                .map(|r| OpBrief::of(r, m.dumped_at));
            RankProgress {
                rank: m.rank,
                comm_rank: c.rank,
                state: format!("{:?}", c.state).to_lowercase(),
                enqueued: c.collective.enqueued,
                started: c.collective.started,
                completed: c.collective.completed,
                p2p_started: c.p2p.started,
                p2p_completed: c.p2p.completed,
                current,
            }
        })
        .collect()
}

/// The call of every rank at each sequence number.
fn calls_by_seq(members: &[Member]) -> CallsBySeq {
    let mut by_seq = CallsBySeq::new();
    for m in members {
        // A queued record carries only its op name (the rest is recorded when it starts).
        for r in collectives(m.comm).filter(|r| r.state != State::Queued) {
            by_seq
                .entry(r.seq)
                .or_default()
                .push((m.rank, Signature::of(r)));
        }
    }
    by_seq
}

/// Mismatches: the same sequence number, different calls.
fn mismatches(by_seq: &CallsBySeq, findings: &mut Vec<String>) -> Vec<Mismatch> {
    let mut mismatches = Vec::new();
    for (&seq, calls) in by_seq {
        if let Some((text, mismatch)) = mismatch_at(seq, calls) {
            findings.push(text);
            mismatches.push(mismatch);
        }
    }
    mismatches
}

/// The mismatch at `seq` and its finding, if the ranks' calls differ.
fn mismatch_at(seq: u64, calls: &[(usize, Signature)]) -> Option<(String, Mismatch)> {
    let mut groups: BTreeMap<&Signature, Vec<usize>> = BTreeMap::new();
    for (rank, sig) in calls {
        groups.entry(sig).or_default().push(*rank);
    }
    if groups.len() < 2 {
        return None;
    }
    let mut groups: Vec<(&Signature, Vec<usize>)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.1.cmp(&b.1)));
    let majority = groups[0].1.len() > groups.get(1).map_or(0, |g| g.1.len());
    let mut fields: Vec<String> = Vec::new();
    for g in &groups[1..] {
        for f in groups[0].0.differences(g.0) {
            if !fields.iter().any(|x| x == f) {
                fields.push(f.into());
            }
        }
    }
    if fields.iter().any(|f| f == "op") {
        fields = vec!["op".into()];
    }
    let odd: Vec<usize> = if majority {
        groups[1..].iter().flat_map(|g| g.1.clone()).collect()
    } else {
        groups.iter().flat_map(|g| g.1.clone()).collect()
    };
    let called =
        |g: &(&Signature, Vec<usize>)| format!("{} called {}", ranks_text(&g.1), g.0.describe());
    let text = if majority {
        let others: Vec<String> = groups[1..].iter().map(called).collect();
        format!(
            "seq {seq}: {} where {} called {} ({} differs)",
            others.join("; "),
            ranks_text(&groups[0].1),
            groups[0].0.describe(),
            fields.join(", ")
        )
    } else {
        let all: Vec<String> = groups.iter().map(called).collect();
        format!(
            "seq {seq}: ranks disagree ({} differs): {}",
            fields.join(", "),
            all.join("; ")
        )
    };
    let mismatch = Mismatch {
        seq,
        fields,
        groups: groups
            .iter()
            .map(|g| MismatchGroup {
                ranks: g.1.clone(),
                call: g.0.describe(),
            })
            .collect(),
        odd_ranks: odd,
    };
    Some((text, mismatch))
}

/// Ranks behind: started less than the furthest rank.
fn behind(
    members: &[Member],
    progress: &[RankProgress],
    by_seq: &CallsBySeq,
    started_by_any: u64,
    findings: &mut Vec<String>,
) -> Vec<Behind> {
    let mut behind = Vec::new();
    for (m, p) in members.iter().zip(progress) {
        if p.started >= started_by_any {
            continue;
        }
        let next = p.started + 1;
        let waited_for = by_seq.get(&next).and_then(|calls| {
            calls
                .iter()
                .find(|(r, _)| *r != m.rank)
                .map(|(_, s)| s.describe())
        });
        let stuck_in = p.current.clone().filter(|c| c.seq == p.started);
        let text = match (&stuck_in, &waited_for) {
            (Some(s), _) => format!(
                "rank {} is behind: stuck in {} seq {} ({}) while others reached seq {}",
                m.rank, s.op, s.seq, s.state, started_by_any
            ),
            (None, Some(w)) => format!(
                "rank {} is behind: it completed seq {} and never called seq {} ({} on the others)",
                m.rank, p.completed, next, w
            ),
            (None, None) => format!(
                "rank {} is behind: last started seq {}, others reached seq {}",
                m.rank, p.started, started_by_any
            ),
        };
        findings.push(text);
        behind.push(Behind {
            rank: m.rank,
            started: p.started,
            completed: p.completed,
            others_started: started_by_any,
            waited_for,
            stuck_in,
        });
    }
    behind
}

/// Stuck, failed or timed-out operations of the ranks (not point-to-point).
fn stuck(progress: &[RankProgress], opts: &Options, findings: &mut Vec<String>) -> Trouble {
    let mut trouble = Trouble::default();
    let mut stuck: BTreeMap<(u64, String, String), Vec<usize>> = BTreeMap::new();
    for p in progress {
        if let Some(c) = &p.current {
            let long = c.running_ms.is_some_and(|ms| ms >= opts.hang_ms as f64);
            if c.state == "timed_out" || c.state == "failed" {
                trouble.failed = true;
            }
            if long {
                trouble.hung = true;
            }
            if long || c.state == "timed_out" || c.state == "failed" {
                stuck
                    .entry((c.seq, c.op.clone(), c.state.clone()))
                    .or_default()
                    .push(p.rank);
            }
        }
    }
    for ((seq, op, state), ranks) in &stuck {
        let what = if state == "started" {
            "stuck in".to_string()
        } else {
            format!("{state}:")
        };
        findings.push(format!("{} {what} {op} seq {seq}", ranks_text(ranks)));
    }
    trouble
}

/// Unfinished point-to-point operations; timed-out ones are findings and failures.
fn p2p(
    members: &[Member],
    global_ranks: &[usize],
    trouble: &mut Trouble,
    findings: &mut Vec<String>,
) -> Vec<(usize, OpBrief)> {
    let mut p2p_pending = Vec::new();
    for m in members {
        for r in m
            .comm
            .records
            .iter()
            .filter(|r| r.kind == RecordKind::P2p && !r.state.is_final())
        {
            p2p_pending.push((m.rank, OpBrief::of(r, m.dumped_at)));
        }
        for r in m
            .comm
            .records
            .iter()
            .filter(|r| r.kind == RecordKind::P2p && r.state == State::TimedOut)
        {
            trouble.failed = true;
            findings.push(format!(
                "rank {} timed out in {} p2p seq {}{}",
                m.rank,
                r.op,
                r.seq,
                r.peer
                    .map(|p| format!(" with peer {}", global_ranks.get(p).copied().unwrap_or(p)))
                    .unwrap_or_default()
            ));
        }
    }
    p2p_pending
}

/// Findings on ranks that never joined, left no dump, or are still joining.
fn missing_findings(members: &[Member], ms: &Membership, findings: &mut Vec<String>) {
    if !ms.never_joined.is_empty() {
        findings.push(format!(
            "{} never joined (dumped, but with no record of this communicator)",
            ranks_text(&ms.never_joined)
        ));
    }
    // Members whose creation of the communicator did not complete.
    let init_failed: Vec<usize> = members
        .iter()
        .filter(|m| {
            m.comm.records.iter().any(|r| {
                r.kind == RecordKind::Comm && r.op == "init" && r.state != State::Completed
            })
        })
        .map(|m| m.rank)
        .collect();
    if !ms.no_dump.is_empty() && !init_failed.is_empty() {
        findings.insert(
            0,
            format!(
                "{} never joined: no dump from it, and {} could not create the communicator without it",
                ranks_text(&ms.no_dump),
                ranks_text(&init_failed)
            ),
        );
    } else if !ms.no_dump.is_empty() {
        findings.push(format!(
            "no dump from {} (process gone, or it never dumped)",
            ranks_text(&ms.no_dump)
        ));
    }
    if !ms.joining.is_empty() {
        findings.push(format!(
            "{} still joining (creation unfinished)",
            ranks_text(&ms.joining)
        ));
    }
}

/// Findings on the ranks that arrive last often and late enough to matter.
fn slow_findings(slowest: &[Slowest], findings: &mut Vec<String>) {
    for s in slowest.iter().filter(|s| s.significant) {
        findings.push(format!(
            "rank {} is the slowest in {}: last to arrive in {} of {}, on average {:.1} ms after the first rank (max {:.1} ms)",
            s.rank, s.op, s.times_last, s.of, s.mean_late_ms, s.max_late_ms
        ));
    }
}

/// The communicator's status, most serious first.
fn status(
    mismatches: &[Mismatch],
    trouble: &Trouble,
    ms: &Membership,
    behind: &[Behind],
    progress: &[RankProgress],
    p2p_pending: &[(usize, OpBrief)],
) -> &'static str {
    if !mismatches.is_empty() {
        "mismatch"
    } else if trouble.hung {
        "hung"
    } else if trouble.failed {
        "failed"
    } else if !ms.never_joined.is_empty()
        || !ms.no_dump.is_empty()
        || !ms.joining.is_empty()
        || !behind.is_empty()
    {
        "incomplete"
    } else if progress.iter().any(|p| p.current.is_some()) || !p2p_pending.is_empty() {
        "running"
    } else {
        "ok"
    }
}
