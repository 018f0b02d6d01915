//! From the dumps of all ranks to a verdict: who is behind, stuck, mismatched, missing or slow,
//! per communicator.

use std::collections::{BTreeMap, BTreeSet};

/// Each rank's dump of one communicator, with the rank's dump index.
type RanksOf<'a> = BTreeMap<usize, (u64, &'a CommDump)>;

use colltrace::schema::{CommDump, CommState, Record, RecordKind, State};
use colltrace::Dump;
use serde::Serialize;

use crate::load::Problem;

/// Settings of the analysis.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// An operation running longer than this (at its rank's dump time) counts as hung.
    pub hang_ms: u64,
    /// A rank counts as slow when it arrives on average this much after the first rank...
    pub slow_ms: f64,
    /// ...and is the last to arrive in at least this fraction of the operations.
    pub slow_fraction: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            hang_ms: 2000,
            slow_ms: 20.0,
            slow_fraction: 0.5,
        }
    }
}

/// A rank that contributed a dump.
#[derive(Debug, Clone, Serialize)]
pub struct RankInfo {
    /// Global rank.
    pub rank: usize,
    /// Host.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Why it dumped (`timeout`, `error`, `abort`, `signal`, `api`, `live`).
    pub trigger: String,
    /// The error or request behind the dump.
    pub reason: Option<String>,
    /// When.
    pub dumped_at_ns: u64,
}

/// The analysis of everything read.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// One line per important finding over all communicators, most important first.
    pub summary: Vec<String>,
    /// The ranks that contributed dumps.
    pub ranks: Vec<RankInfo>,
    /// Sources that could not be read.
    pub problems: Vec<Problem>,
    /// Per communicator.
    pub comms: Vec<CommVerdict>,
}

/// An operation, in brief.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpBrief {
    /// Sequence number.
    pub seq: u64,
    /// Operation.
    pub op: String,
    /// State.
    pub state: String,
    /// Element type.
    pub dtype: Option<String>,
    /// Elements.
    pub count: Option<u64>,
    /// Bytes in and out.
    pub in_bytes: u64,
    /// Bytes out.
    pub out_bytes: u64,
    /// Root.
    pub root: Option<usize>,
    /// Peer.
    pub peer: Option<usize>,
    /// Reduction.
    pub reduce_op: Option<String>,
    /// Milliseconds it has been running at dump time (unfinished operations).
    pub running_ms: Option<f64>,
    /// Error.
    pub error: Option<String>,
}

impl OpBrief {
    fn of(r: &Record, dumped_at: u64) -> OpBrief {
        let running = (!r.state.is_final() && r.started_ns > 0)
            .then(|| dumped_at.saturating_sub(r.started_ns) as f64 / 1e6);
        OpBrief {
            seq: r.seq,
            op: r.op.clone(),
            state: r.state.name().into(),
            dtype: r.dtype.clone(),
            count: r.count,
            in_bytes: r.in_bytes,
            out_bytes: r.out_bytes,
            root: r.root,
            peer: r.peer,
            reduce_op: r.reduce_op.clone(),
            running_ms: running,
            error: r.error.clone(),
        }
    }
}

/// Progress of one rank in one communicator.
#[derive(Debug, Clone, Serialize)]
pub struct RankProgress {
    /// Global rank.
    pub rank: usize,
    /// Rank in the communicator.
    pub comm_rank: usize,
    /// Communicator state on this rank.
    pub state: String,
    /// Highest collective sequence number submitted.
    pub enqueued: u64,
    /// Highest collective sequence number started.
    pub started: u64,
    /// Highest collective sequence number completed.
    pub completed: u64,
    /// Highest p2p sequence number started.
    pub p2p_started: u64,
    /// Highest p2p sequence number completed.
    pub p2p_completed: u64,
    /// The unfinished collective or comm operation it is in, if any.
    pub current: Option<OpBrief>,
}

/// Ranks that disagree about the operation at one sequence number.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    /// Sequence number.
    pub seq: u64,
    /// The fields that differ (`op`, `dtype`, `count`, `bytes`, `root`, `reduce_op`).
    pub fields: Vec<String>,
    /// Ranks (global) grouped by what they called, largest group first.
    pub groups: Vec<MismatchGroup>,
    /// The ranks outside the majority (all of them when there is no majority).
    pub odd_ranks: Vec<usize>,
}

/// Ranks that called the same thing.
#[derive(Debug, Clone, Serialize)]
pub struct MismatchGroup {
    /// Global ranks.
    pub ranks: Vec<usize>,
    /// What they called.
    pub call: String,
}

/// A rank behind the others.
#[derive(Debug, Clone, Serialize)]
pub struct Behind {
    /// Global rank.
    pub rank: usize,
    /// Its highest started collective.
    pub started: u64,
    /// Its highest completed collective.
    pub completed: u64,
    /// The highest collective any rank started.
    pub others_started: u64,
    /// What the others run at the next sequence number.
    pub waited_for: Option<String>,
    /// The operation it is stuck in, if it is in one.
    pub stuck_in: Option<OpBrief>,
}

/// The latest rank to arrive at an operation.
#[derive(Debug, Clone, Serialize)]
pub struct Slowest {
    /// Operation name.
    pub op: String,
    /// Global rank that arrived last most often (largest mean lateness).
    pub rank: usize,
    /// How often it was last.
    pub times_last: usize,
    /// Operations compared.
    pub of: usize,
    /// Mean delay of its arrival after the first rank's, ms.
    pub mean_late_ms: f64,
    /// Largest such delay, ms.
    pub max_late_ms: f64,
    /// Whether this counts as a finding (see [`Options`]).
    pub significant: bool,
}

/// One operation of one rank, for the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineEntry {
    /// `collective`, `p2p` or `comm`.
    pub kind: String,
    /// Sequence number.
    pub seq: u64,
    /// Operation.
    pub op: String,
    /// State.
    pub state: String,
    /// Bytes in.
    pub bytes: u64,
    /// Algorithm.
    pub algorithm: Option<String>,
    /// Submission, start and end, ms after the earliest event of the communicator (end: null
    /// while running).
    pub enqueued_ms: f64,
    /// Start (null: not started).
    pub started_ms: Option<f64>,
    /// End (null: not finished).
    pub ended_ms: Option<f64>,
    /// Error.
    pub error: Option<String>,
}

/// The timeline of one rank.
#[derive(Debug, Clone, Serialize)]
pub struct RankTimeline {
    /// Global rank.
    pub rank: usize,
    /// Time of its dump, ms after the origin.
    pub dumped_ms: f64,
    /// Its operations, oldest first.
    pub entries: Vec<TimelineEntry>,
}

/// The verdict on one communicator.
#[derive(Debug, Clone, Serialize)]
pub struct CommVerdict {
    /// Name.
    pub name: String,
    /// Instance (see the schema).
    pub instance: u64,
    /// Number of ranks.
    pub size: usize,
    /// Global rank of each member.
    pub global_ranks: Vec<usize>,
    /// `ok`, `running`, `hung`, `mismatch`, `failed` or `incomplete`.
    pub status: String,
    /// Findings, most important first.
    pub findings: Vec<String>,
    /// Highest collective sequence number completed by every rank present.
    pub completed_by_all: u64,
    /// Highest collective sequence number started by every rank present.
    pub started_by_all: u64,
    /// Highest collective sequence number started by any rank.
    pub started_by_any: u64,
    /// Per rank.
    pub progress: Vec<RankProgress>,
    /// Ranks behind the others.
    pub behind: Vec<Behind>,
    /// Disagreements.
    pub mismatches: Vec<Mismatch>,
    /// Ranks that dumped but have no record of this communicator.
    pub never_joined: Vec<usize>,
    /// Members with no dump at all.
    pub no_dump: Vec<usize>,
    /// Ranks still connecting (creation unfinished).
    pub joining: Vec<usize>,
    /// Unfinished point-to-point operations.
    pub p2p_pending: Vec<(usize, OpBrief)>,
    /// Latest arrival per operation name.
    pub slowest: Vec<Slowest>,
    /// Per rank, oldest operation first.
    pub timeline: Vec<RankTimeline>,
}

fn ranks_text(r: &[usize]) -> String {
    let s: Vec<String> = r.iter().map(|x| x.to_string()).collect();
    match r.len() {
        1 => format!("rank {}", s[0]),
        _ => format!("ranks {}", s.join(",")),
    }
}

/// What every rank of a collective must agree on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Signature {
    op: String,
    dtype: Option<String>,
    count: Option<u64>,
    bytes: Option<u64>,
    root: Option<usize>,
    reduce_op: Option<String>,
}

impl Signature {
    fn of(r: &Record) -> Signature {
        // The size all ranks must pass: the buffer (all_reduce, reduce, broadcast), the gathered
        // output (all_gather), the whole input (reduce_scatter), the piece (scatter, gather);
        // all_to_all sizes may differ per rank.
        let bytes = match r.op.as_str() {
            "all_reduce" | "reduce" | "broadcast" | "reduce_scatter" | "gather" => Some(r.in_bytes),
            "all_gather" | "scatter" => Some(r.out_bytes),
            _ => None,
        };
        let count = match r.op.as_str() {
            "all_reduce" | "reduce" => r.count,
            _ => None,
        };
        Signature {
            op: r.op.clone(),
            dtype: r.dtype.clone(),
            count,
            bytes,
            root: r.root,
            reduce_op: r.reduce_op.clone(),
        }
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = &self.dtype {
            parts.push(d.clone());
        }
        if let Some(c) = self.count {
            parts.push(format!("{c} elements"));
        }
        if let Some(b) = self.bytes {
            parts.push(format!("{b} B"));
        }
        if let Some(r) = self.root {
            parts.push(format!("root {r}"));
        }
        if let Some(o) = &self.reduce_op {
            parts.push(o.clone());
        }
        if parts.is_empty() {
            self.op.clone()
        } else {
            format!("{} ({})", self.op, parts.join(", "))
        }
    }

    fn differences(&self, o: &Signature) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.op != o.op {
            d.push("op");
        }
        if self.dtype != o.dtype {
            d.push("dtype");
        }
        if self.count != o.count {
            d.push("count");
        }
        if self.bytes != o.bytes {
            d.push("bytes");
        }
        if self.root != o.root {
            d.push("root");
        }
        if self.reduce_op != o.reduce_op {
            d.push("reduce_op");
        }
        d
    }
}

/// One rank's view of one communicator.
struct Member<'a> {
    rank: usize,
    dumped_at: u64,
    comm: &'a CommDump,
}

fn latest_per_rank(dumps: &[Dump]) -> BTreeMap<usize, &Dump> {
    let mut m: BTreeMap<usize, &Dump> = BTreeMap::new();
    for d in dumps {
        let e = m.entry(d.rank).or_insert(d);
        if d.dumped_at_ns > e.dumped_at_ns {
            *e = d;
        }
    }
    m
}

/// Analyzes the dumps (several per rank are fine: the latest copy of each communicator wins).
pub fn analyze(dumps: &[Dump], problems: Vec<Problem>, opts: &Options) -> Verdict {
    let ranks: Vec<RankInfo> = latest_per_rank(dumps)
        .values()
        .map(|d| RankInfo {
            rank: d.rank,
            host: d.host.clone(),
            pid: d.pid,
            trigger: d.trigger.name().into(),
            reason: d.reason.clone(),
            dumped_at_ns: d.dumped_at_ns,
        })
        .collect();
    // (name, instance) -> global rank -> (dumped_at, comm)
    let mut comms: BTreeMap<(String, u64), RanksOf<'_>> = BTreeMap::new();
    let mut order: Vec<(String, u64)> = Vec::new();
    for d in dumps {
        for c in &d.comms {
            let key = (c.name.clone(), c.instance);
            if !order.contains(&key) {
                order.push(key.clone());
            }
            let by_rank = comms.entry(key).or_default();
            let e = by_rank.entry(d.rank).or_insert((d.dumped_at_ns, c));
            if d.dumped_at_ns > e.0 {
                *e = (d.dumped_at_ns, c);
            }
        }
    }
    let dumped: BTreeSet<usize> = ranks.iter().map(|r| r.rank).collect();
    let mut out: Vec<CommVerdict> = order
        .iter()
        .map(|key| {
            let members: Vec<Member> = comms[key]
                .iter()
                .map(|(&rank, &(dumped_at, comm))| Member {
                    rank,
                    dumped_at,
                    comm,
                })
                .collect();
            analyze_comm(&key.0, key.1, &members, &dumped, opts)
        })
        .collect();
    // Communicators with problems first, then in creation order.
    out.sort_by_key(|c| match c.status.as_str() {
        "mismatch" => 0,
        "hung" => 1,
        "failed" => 2,
        "incomplete" => 3,
        "running" => 4,
        _ => 5,
    });
    let mut summary = Vec::new();
    for p in &problems {
        summary.push(format!("could not read {}: {}", p.source, p.reason));
    }
    for c in &out {
        for f in &c.findings {
            summary.push(format!("comm {}: {f}", c.name));
        }
    }
    if out.is_empty() {
        summary.push("no communicator found in the dumps".into());
    } else if out.iter().all(|c| c.status == "ok") {
        summary.push(format!(
            "all {} communicator(s) healthy: every rank completed every operation it started",
            out.len()
        ));
    }
    Verdict {
        summary,
        ranks,
        problems,
        comms: out,
    }
}

fn collectives(c: &CommDump) -> impl Iterator<Item = &Record> {
    c.records
        .iter()
        .filter(|r| r.kind == RecordKind::Collective)
}

fn analyze_comm(
    name: &str,
    instance: u64,
    members: &[Member],
    dumped: &BTreeSet<usize>,
    opts: &Options,
) -> CommVerdict {
    let first = members[0].comm;
    let size = first.size;
    let global_ranks = first.global_ranks.clone();
    let present: Vec<usize> = members.iter().map(|m| m.rank).collect();
    let mut findings = Vec::new();
    let mut status = "ok";

    // Ranks that never joined, or left no dump.
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

    // Progress per rank.
    let progress: Vec<RankProgress> = members
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
        .collect();
    let completed_by_all = progress.iter().map(|p| p.completed).min().unwrap_or(0);
    let started_by_all = progress.iter().map(|p| p.started).min().unwrap_or(0);
    let started_by_any = progress.iter().map(|p| p.started).max().unwrap_or(0);

    // Mismatches: the same sequence number, different calls.
    let mut by_seq: BTreeMap<u64, Vec<(usize, Signature)>> = BTreeMap::new();
    for m in members {
        // A queued record carries only its op name (the rest is recorded when it starts).
        for r in collectives(m.comm).filter(|r| r.state != State::Queued) {
            by_seq
                .entry(r.seq)
                .or_default()
                .push((m.rank, Signature::of(r)));
        }
    }
    let mut mismatches = Vec::new();
    for (&seq, calls) in &by_seq {
        let mut groups: BTreeMap<&Signature, Vec<usize>> = BTreeMap::new();
        for (rank, sig) in calls {
            groups.entry(sig).or_default().push(*rank);
        }
        if groups.len() < 2 {
            continue;
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
        let text = if majority {
            let others: Vec<String> = groups[1..]
                .iter()
                .map(|g| format!("{} called {}", ranks_text(&g.1), g.0.describe()))
                .collect();
            format!(
                "seq {seq}: {} where {} called {} ({} differs)",
                others.join("; "),
                ranks_text(&groups[0].1),
                groups[0].0.describe(),
                fields.join(", ")
            )
        } else {
            let all: Vec<String> = groups
                .iter()
                .map(|g| format!("{} called {}", ranks_text(&g.1), g.0.describe()))
                .collect();
            format!(
                "seq {seq}: ranks disagree ({} differs): {}",
                fields.join(", "),
                all.join("; ")
            )
        };
        findings.push(text);
        mismatches.push(Mismatch {
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
        });
    }
    if !mismatches.is_empty() {
        status = "mismatch";
    }

    // Behind: started less than the furthest rank.
    let mut behind = Vec::new();
    for (m, p) in members.iter().zip(&progress) {
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

    // Stuck, failed or timed-out operations.
    let mut hung = false;
    let mut failed = false;
    let mut stuck: BTreeMap<(u64, String, String), Vec<usize>> = BTreeMap::new();
    for p in &progress {
        if let Some(c) = &p.current {
            let long = c.running_ms.is_some_and(|ms| ms >= opts.hang_ms as f64);
            if c.state == "timed_out" || c.state == "failed" {
                failed = true;
            }
            if long {
                hung = true;
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
            failed = true;
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
    if members
        .iter()
        .any(|m| matches!(m.comm.state, CommState::Failed | CommState::Aborted))
    {
        failed = true;
    }
    if !never_joined.is_empty() {
        findings.push(format!(
            "{} never joined (dumped, but with no record of this communicator)",
            ranks_text(&never_joined)
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
    if !no_dump.is_empty() && !init_failed.is_empty() {
        findings.insert(
            0,
            format!(
                "{} never joined: no dump from it, and {} could not create the communicator without it",
                ranks_text(&no_dump),
                ranks_text(&init_failed)
            ),
        );
    } else if !no_dump.is_empty() {
        findings.push(format!(
            "no dump from {} (process gone, or it never dumped)",
            ranks_text(&no_dump)
        ));
    }
    if !joining.is_empty() {
        findings.push(format!(
            "{} still joining (creation unfinished)",
            ranks_text(&joining)
        ));
    }

    // Arrival skew: who starts each collective last.
    let slowest = arrival_skew(members, opts);
    for s in slowest.iter().filter(|s| s.significant) {
        findings.push(format!(
            "rank {} is the slowest in {}: last to arrive in {} of {}, on average {:.1} ms after the first rank (max {:.1} ms)",
            s.rank, s.op, s.times_last, s.of, s.mean_late_ms, s.max_late_ms
        ));
    }

    if status == "ok" {
        status = if hung {
            "hung"
        } else if failed {
            "failed"
        } else if !never_joined.is_empty()
            || !no_dump.is_empty()
            || !joining.is_empty()
            || !behind.is_empty()
        {
            "incomplete"
        } else if progress.iter().any(|p| p.current.is_some()) || !p2p_pending.is_empty() {
            "running"
        } else {
            "ok"
        };
    }
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
        never_joined,
        no_dump,
        joining,
        p2p_pending,
        slowest,
        timeline: timeline(members),
    }
}

fn arrival_skew(members: &[Member], opts: &Options) -> Vec<Slowest> {
    if members.len() < 2 {
        return Vec::new();
    }
    let mut starts: BTreeMap<u64, (String, Vec<(usize, u64)>)> = BTreeMap::new();
    for m in members {
        for r in collectives(m.comm).filter(|r| r.started_ns > 0) {
            let e = starts
                .entry(r.seq)
                .or_insert_with(|| (r.op.clone(), Vec::new()));
            e.1.push((m.rank, r.started_ns));
        }
    }
    // op -> rank -> (sum late ns, max late ns, times last, n)
    let mut per_op: BTreeMap<String, BTreeMap<usize, (f64, f64, usize)>> = BTreeMap::new();
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    for (op, arrivals) in starts.values() {
        if arrivals.len() != members.len() {
            continue;
        }
        let first = arrivals.iter().map(|a| a.1).min().unwrap_or(0);
        let last = arrivals.iter().max_by_key(|a| a.1).map(|a| a.0);
        *count.entry(op.clone()).or_default() += 1;
        let e = per_op.entry(op.clone()).or_default();
        for &(rank, t) in arrivals {
            let late = (t - first) as f64 / 1e6;
            let s = e.entry(rank).or_insert((0.0, 0.0, 0));
            s.0 += late;
            s.1 = s.1.max(late);
            if Some(rank) == last {
                s.2 += 1;
            }
        }
    }
    per_op
        .into_iter()
        .filter_map(|(op, ranks)| {
            let n = count[&op];
            let (rank, (sum, max, last)) =
                ranks.into_iter().max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))?;
            let mean = sum / n as f64;
            Some(Slowest {
                significant: mean >= opts.slow_ms && last as f64 >= opts.slow_fraction * n as f64,
                op,
                rank,
                times_last: last,
                of: n,
                mean_late_ms: mean,
                max_late_ms: max,
            })
        })
        .collect()
}

fn timeline(members: &[Member]) -> Vec<RankTimeline> {
    let origin = members
        .iter()
        .flat_map(|m| m.comm.records.iter().map(|r| r.enqueued_ns))
        .filter(|&t| t > 0)
        .min()
        .unwrap_or(0);
    let ms = |t: u64| (t.saturating_sub(origin)) as f64 / 1e6;
    members
        .iter()
        .map(|m| RankTimeline {
            rank: m.rank,
            dumped_ms: ms(m.dumped_at),
            entries: m
                .comm
                .records
                .iter()
                .map(|r| TimelineEntry {
                    kind: match r.kind {
                        RecordKind::Collective => "collective",
                        RecordKind::P2p => "p2p",
                        RecordKind::Comm => "comm",
                    }
                    .into(),
                    seq: r.seq,
                    op: r.op.clone(),
                    state: r.state.name().into(),
                    bytes: r.in_bytes,
                    algorithm: r.algorithm.clone(),
                    enqueued_ms: ms(r.enqueued_ns),
                    started_ms: (r.started_ns > 0).then(|| ms(r.started_ns)),
                    ended_ms: (r.ended_ns > 0).then(|| ms(r.ended_ns)),
                    error: r.error.clone(),
                })
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use colltrace::schema::{SeqCounters, SCHEMA_NAME, SCHEMA_VERSION};
    use colltrace::Trigger;

    use super::*;

    fn rec(seq: u64, op: &str, count: u64, state: State, started_ns: u64) -> Record {
        Record {
            id: seq,
            kind: RecordKind::Collective,
            seq,
            op: op.into(),
            dtype: Some("f32".into()),
            count: Some(count),
            in_bytes: 4 * count,
            out_bytes: 4 * count,
            root: None,
            peer: None,
            peers: None,
            reduce_op: Some("sum".into()),
            async_op: None,
            algorithm: None,
            transport: None,
            timeout_ms: 1000,
            state,
            enqueued_ns: started_ns,
            started_ns,
            ended_ns: if state.is_final() { started_ns + 10 } else { 0 },
            error: None,
            detail: None,
        }
    }

    fn dump(rank: usize, size: usize, records: Vec<Record>) -> Dump {
        let done = records
            .iter()
            .filter(|r| r.state == State::Completed)
            .map(|r| r.seq)
            .max()
            .unwrap_or(0);
        let started = records
            .iter()
            .filter(|r| r.state != State::Queued)
            .map(|r| r.seq)
            .max()
            .unwrap_or(0);
        Dump {
            schema: SCHEMA_NAME.into(),
            version: SCHEMA_VERSION,
            rank,
            pid: 1,
            host: "h".into(),
            trigger: Trigger::Api,
            reason: None,
            dumped_at_ns: 10_000_000_000,
            endpoint: None,
            comms: vec![CommDump {
                name: "c".into(),
                instance: 1,
                rank,
                size,
                global_ranks: (0..size).collect(),
                transport: None,
                state: CommState::Active,
                error: None,
                buffer_size: 10,
                dropped: 0,
                created_ns: 0,
                collective: SeqCounters {
                    enqueued: started,
                    started,
                    completed: done,
                },
                p2p: SeqCounters::default(),
                records,
            }],
        }
    }

    #[test]
    fn two_ranks_that_disagree_are_both_named_and_queued_records_are_not_compared() {
        let a = dump(0, 2, vec![rec(1, "all_reduce", 2, State::Started, 5)]);
        let b = dump(
            1,
            2,
            vec![
                rec(1, "all_reduce", 3, State::Started, 5),
                rec(2, "barrier", 0, State::Queued, 6),
            ],
        );
        let v = analyze(&[a, b], Vec::new(), &Options::default());
        let c = &v.comms[0];
        assert_eq!(c.status, "mismatch");
        assert_eq!(c.mismatches.len(), 1);
        assert_eq!(c.mismatches[0].odd_ranks, vec![0, 1]);
        assert!(c.findings[0].contains("ranks disagree"), "{:?}", c.findings);
    }

    #[test]
    fn a_rank_behind_is_named_with_what_the_others_run() {
        let mut recs = vec![rec(1, "all_reduce", 2, State::Completed, 1)];
        let a = dump(0, 3, recs.clone());
        recs.push(rec(2, "all_gather", 2, State::Started, 2));
        let b = dump(1, 3, recs.clone());
        let c = dump(2, 3, recs);
        let v = analyze(&[a, b, c], Vec::new(), &Options::default());
        let comm = &v.comms[0];
        assert_eq!(comm.behind.len(), 1);
        assert_eq!(comm.behind[0].rank, 0);
        assert!(
            comm.findings.iter().any(|f| f.contains(
                "rank 0 is behind: it completed seq 1 and never called seq 2 (all_gather"
            )),
            "{:?}",
            comm.findings
        );
        assert_eq!((comm.completed_by_all, comm.started_by_any), (1, 2));
    }
}
