//! Timing across ranks: who arrives last at each collective, and every rank's timeline.

use std::collections::BTreeMap;

use colltrace::schema::RecordKind;

use super::report::{RankTimeline, Slowest, TimelineEntry};
use super::{collectives, Member, Options};

pub(super) fn arrival_skew(members: &[Member], opts: &Options) -> Vec<Slowest> {
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

pub(super) fn timeline(members: &[Member]) -> Vec<RankTimeline> {
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
