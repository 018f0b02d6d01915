//! From the dumps of all ranks to a verdict: who is behind, stuck, mismatched, missing or slow,
//! per communicator.

mod comm;
mod report;
mod signature;
#[cfg(test)]
mod tests;
mod timing;

use std::collections::{BTreeMap, BTreeSet};

use colltrace::schema::{CommDump, Record, RecordKind};
use colltrace::Dump;

use crate::load::Problem;
pub use report::{
    Behind, CommVerdict, Mismatch, MismatchGroup, OpBrief, RankInfo, RankProgress, RankTimeline,
    Slowest, TimelineEntry, Verdict,
};

/// Each rank's dump of one communicator, with the rank's dump index.
type RanksOf<'a> = BTreeMap<usize, (u64, &'a CommDump)>;

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
fn ranks_text(r: &[usize]) -> String {
    let s: Vec<String> = r.iter().map(|x| x.to_string()).collect();
    match r.len() {
        1 => format!("rank {}", s[0]),
        _ => format!("ranks {}", s.join(",")),
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
            comm::analyze_comm(&key.0, key.1, &members, &dumped, opts)
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
