//! Dumping a trace: both sides of the ring merged by record id.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{lock, CommTrace, Misc, Queued, Rec};
use crate::schema::{CommDump, Record, RecordKind, SeqCounters, State};

impl CommTrace {
    /// A copy of everything, for a dump.
    pub fn snapshot(&self) -> CommDump {
        let clock = self.clock;
        clock.refresh();
        let ex = &self.exec;
        // Ends written after their caller was told (the writer does so when it would only wait
        // anyway: within microseconds unless it is descheduled): wait for them, so that a
        // completed wait dumps as completed.
        if ex.unwritten.load(Ordering::Acquire) != 0 {
            let until = std::time::Instant::now() + Duration::from_millis(20);
            while ex.unwritten.load(Ordering::Acquire) != 0 && std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        }
        // Counters before records: a record newer than a counter is fine, the reverse would
        // show a completed count ahead of its record.
        let coll = (
            ex.coll_started.load(Ordering::Acquire),
            ex.coll_completed.load(Ordering::Acquire),
        );
        let p2p = (
            ex.p2p_started.load(Ordering::Acquire),
            ex.p2p_completed.load(Ordering::Acquire),
        );
        // Execution side first: an operation that moves from queued to started in between
        // shows as queued, never twice.
        let n = ex.count.load(Ordering::Acquire);
        let cap = ex.slots.len() as u64;
        let mut exec: Vec<Rec> = Vec::new();
        for i in n.saturating_sub(cap)..n {
            if let Some(w) = ex.slots[(i % cap) as usize].read() {
                let r = Rec::unpack(w);
                if r.id != 0 {
                    exec.push(r);
                }
            }
        }
        let queued: Vec<Queued> = self
            .queued
            .iter()
            .filter_map(|s| s.read())
            .map(Queued::unpack)
            .filter(|q| q.id > 0)
            .collect();
        let misc: Vec<Misc> = lock(&self.misc).iter().cloned().collect();
        // Operations completed on the submitting thread count as started and completed too.
        let inline = |kind: RecordKind| {
            misc.iter()
                .filter(|m| m.rec.kind == kind && m.rec.state == State::Completed)
                .map(|m| m.rec.seq)
                .max()
                .unwrap_or(0)
        };
        let (ci, pi) = (inline(RecordKind::Collective), inline(RecordKind::P2p));
        let coll = (coll.0.max(ci), coll.1.max(ci));
        let p2p = (p2p.0.max(pi), p2p.1.max(pi));
        let next_id = self.next_id.load(Ordering::Relaxed);
        let enq = [
            self.enqueued[0].load(Ordering::Relaxed),
            self.enqueued[1].load(Ordering::Relaxed),
        ];
        // Precedence: the progress thread's record, then full records of the submitting side
        // (communicator steps, refusals), then the queued stub.
        let mut by_id: BTreeMap<u64, Record> = BTreeMap::new();
        for q in &queued {
            by_id.insert(q.id, Rec::queued(q).to_record(clock, None));
        }
        for m in &misc {
            by_id.insert(m.rec.id, m.rec.to_record(clock, Some(&m.extra)));
        }
        {
            let extra = lock(&ex.extra);
            for r in exec {
                by_id.insert(r.id, r.to_record(clock, extra.get(&r.id)));
            }
        }
        let skip = by_id.len().saturating_sub(self.capacity);
        let records: Vec<Record> = by_id.into_values().skip(skip).collect();
        let status = lock(&self.status);
        CommDump {
            name: self.meta.name.clone(),
            instance: self.meta.instance,
            rank: self.meta.rank,
            size: self.meta.size,
            global_ranks: self.meta.global_ranks.clone(),
            transport: status.transport.map(Into::into),
            state: status.state,
            error: status.error.clone(),
            buffer_size: self.capacity,
            dropped: next_id
                .saturating_sub(1)
                .saturating_sub(records.len() as u64),
            created_ns: self.created_ns,
            collective: SeqCounters {
                enqueued: enq[0].max(coll.0).max(coll.1),
                started: coll.0,
                completed: coll.1,
            },
            p2p: SeqCounters {
                enqueued: enq[1].max(p2p.0).max(p2p.1),
                started: p2p.0,
                completed: p2p.1,
            },
            records,
        }
    }
}
