//! The progress thread's writer of started and finished operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::handle::{OpRecord, Outcome, NOT_STARTED};
use super::record::{
    rank_code, state_code, state_of, ENDED_WORD, FLAGS_WORD, NO_COUNT, STATE_SHIFT,
};
use super::{
    lock, seq_index, CommTrace, Extra, OpInfo, Queued, Rec, Slot, ENQUEUED_AT_START, WORDS,
};
use crate::names;
use crate::schema::{RecordKind, State};

/// The progress thread's side of a [`CommTrace`]: the only writer of started and finished
/// operations (one per trace, from [`CommTrace::writer`]), so that it writes them with plain
/// stores under a per-slot sequence number instead of a lock.
///
/// Start times come without a clock read while the thread only polls for work: it keeps an
/// anchor, the end of the operation it finished last, refreshed by [`TraceWriter::mark`] as it
/// spins. An operation found then started at the later of its enqueue time and the anchor (at
/// most a few polls off: the thread picked it up within a poll of its arrival, or straight
/// after the previous end when it was queued behind). A thread that may sleep or do other work
/// first calls [`TraceWriter::idle`] (or [`TraceWriter::park`]), and the next start reads the
/// clock.
#[derive(Debug)]
pub struct TraceWriter {
    pub(super) trace: Arc<CommTrace>,
    /// False when tracing is off or this is not the trace's first writer.
    pub(super) on: bool,
    /// Records started (this thread's copy of `ExecSide::count`).
    pub(super) count: u64,
    /// Slot of the next record (`count % capacity`, kept without dividing).
    pub(super) next: usize,
    /// A time at most a few polls before now while the thread has only polled for work since:
    /// the last end or [`TraceWriter::mark`]; 0 otherwise.
    pub(super) anchor: u64,
    /// This thread's copy of `CommTrace::parked`.
    pub(super) parked: bool,
    /// This thread's copy of `ExecSide::unwritten`.
    pub(super) unwritten: u64,
    /// Highest sequence numbers started and completed, collective then p2p.
    pub(super) started: [u64; 2],
    pub(super) completed: [u64; 2],
}

impl TraceWriter {
    /// The trace this writer writes.
    pub fn trace(&self) -> &Arc<CommTrace> {
        &self.trace
    }

    /// The thread may wait for work now (or do something else than the next operation): the
    /// next start reads the clock instead of reusing the anchor.
    #[inline]
    pub fn idle(&mut self) {
        self.anchor = 0;
    }

    /// The thread is polling for work and has done nothing else since the last end or mark:
    /// the anchor moves to now. Called every few polls of a spin, off any operation's path.
    #[inline]
    pub fn mark(&mut self) {
        if self.on {
            self.anchor = self.trace.clock.now();
        }
    }

    /// `rec` starts now, though its record is written later ([`TraceWriter::start`] at its
    /// first wait: a hang always passes one, so a dump still shows it started, and the
    /// record's stores overlap the wait for peers instead of delaying this rank's arrival).
    /// Fixes the start time: the anchor, or a clock read when there is none.
    #[inline]
    pub fn pin_start(&mut self, rec: &OpRecord) {
        if rec.q.id != 0 && self.on && self.anchor == 0 {
            self.anchor = self.trace.clock.now();
        }
    }

    /// The thread is about to sleep until work arrives (`true`), or woke (`false`). While it
    /// sleeps, submissions read the clock: a wake-up is not a poll.
    pub fn park(&mut self, parked: bool) {
        self.anchor = 0;
        // Stored on changes only: every submission reads it.
        if self.on && self.parked != parked {
            self.parked = parked;
            self.trace.parked.store(parked, Ordering::Relaxed);
        }
    }

    fn slot(&self, i: u64) -> &Slot<WORDS> {
        &self.trace.exec.slots[i as usize]
    }

    /// Publishes a new record in the next slot and returns the slot's index.
    fn push(&mut self, r: &Rec) -> u64 {
        let i = self.next;
        let slots = &self.trace.exec.slots;
        slots[i].write(r.pack());
        self.count += 1;
        self.next = if i + 1 == slots.len() { 0 } else { i + 1 };
        self.trace.exec.count.store(self.count, Ordering::Release);
        if self.next == 0 && self.count > slots.len() as u64 {
            // Once per round of the ring: rare parts of records that left it go too.
            let oldest = slots[0].own()[0];
            let mut extra = lock(&self.trace.exec.extra);
            while extra.first_key_value().is_some_and(|(k, _)| *k < oldest) {
                extra.pop_first();
            }
        }
        i as u64
    }

    /// The progress thread started `rec` over `transport` with `algorithm`; `info` describes
    /// the op (computed here, so the caller's path and the task crossing threads stay small).
    /// Calling it again for the same record only updates the transport and algorithm.
    pub fn start(
        &mut self,
        rec: &mut OpRecord,
        info: impl FnOnce() -> OpInfo,
        transport: Option<&'static str>,
        algorithm: Option<&'static str>,
    ) {
        // Whatever starts now (also an operation not recorded) ends the polling.
        let anchor = std::mem::take(&mut self.anchor);
        if rec.q.id == 0 || !self.on {
            return;
        }
        if rec.slot != NOT_STARTED {
            let slot = self.slot(rec.slot);
            let mut r = Rec::unpack(slot.own());
            if r.id == rec.q.id {
                r.transport = names::opt_code(transport).max(r.transport);
                if algorithm.is_some() {
                    r.algorithm = names::opt_code(algorithm);
                }
                slot.write(r.pack());
            }
            return;
        }
        let r = self.started_rec(&rec.q, anchor, info, transport, algorithm);
        rec.slot = self.push(&r);
        self.bump_started(r.kind, r.seq);
    }

    /// The record of `q` starting at `anchor` (0: now), and its batch peers noted aside.
    fn started_rec(
        &mut self,
        q: &Queued,
        anchor: u64,
        info: impl FnOnce() -> OpInfo,
        transport: Option<&'static str>,
        algorithm: Option<&'static str>,
    ) -> Rec {
        let (enqueued, started) = match (q.enqueued, anchor) {
            (ENQUEUED_AT_START, 0) => {
                let now = self.trace.clock.now();
                (now, now)
            }
            (ENQUEUED_AT_START, a) => (a, a),
            (e, 0) => (e, self.trace.clock.now()),
            // Queued behind the last end (started there) or arrived while polling (picked up
            // within a poll). enqueued <= started holds.
            (e, a) => (e, e.max(a)),
        };
        let info = info();
        if !info.peers.is_empty() {
            let peers = Some(info.peers.into_boxed_slice());
            lock(&self.trace.exec.extra).insert(
                q.id,
                Extra {
                    peers,
                    ..Extra::default()
                },
            );
        }
        Rec {
            id: q.id,
            seq: q.seq,
            enqueued,
            started,
            ended: 0,
            count: info.count.unwrap_or(NO_COUNT),
            in_bytes: info.in_bytes,
            out_bytes: info.out_bytes,
            root: rank_code(info.root),
            peer: rank_code(info.peer),
            timeout_ms: q.timeout_ms,
            op: q.op,
            dtype: names::opt_code(info.dtype),
            reduce_op: names::opt_code(info.reduce_op),
            algorithm: names::opt_code(algorithm),
            transport: names::opt_code(transport),
            kind: q.kind,
            state: State::Started,
            async_op: q.async_op,
        }
    }

    fn bump_started(&mut self, kind: RecordKind, seq: u64) {
        let ex = &self.trace.exec;
        raise(
            &mut self.started,
            [&ex.coll_started, &ex.p2p_started],
            kind,
            seq,
        );
    }

    /// The progress thread finished `rec` (also when it never started it). The first end
    /// recorded wins.
    pub fn finish(&mut self, rec: &mut OpRecord, outcome: Outcome<'_>) {
        if rec.q.id == 0 || !self.on {
            self.anchor = 0;
            return;
        }
        let now = self.trace.clock.now();
        self.anchor = now;
        if rec.slot == NOT_STARTED {
            let mut r = Rec::queued_until(&rec.q, now);
            r.started = now;
            r.state = State::Started;
            rec.slot = self.push(&r);
        }
        let slot = self.slot(rec.slot);
        // Only the end time and the state change: read the id and the flags, write the end
        // and the flags (two words, not the whole record).
        let flags = slot.own_word(FLAGS_WORD);
        if slot.own_word(0) != rec.q.id || state_of((flags >> STATE_SHIFT) & 7).is_final() {
            return;
        }
        let (state, error) = outcome.parts();
        if let Some(e) = error {
            lock(&self.trace.exec.extra)
                .entry(rec.q.id)
                .or_default()
                .error = Some(e);
        }
        let flags = (flags & !(7 << STATE_SHIFT)) | state_code(state) << STATE_SHIFT;
        slot.write_two((ENDED_WORD, now), (FLAGS_WORD, flags));
        if state == State::Completed {
            self.bump_completed(rec.q.kind, rec.q.seq);
        }
    }

    fn bump_completed(&mut self, kind: RecordKind, seq: u64) {
        let ex = &self.trace.exec;
        raise(
            &mut self.completed,
            [&ex.coll_completed, &ex.p2p_completed],
            kind,
            seq,
        );
    }

    /// Like [`TraceWriter::finish`], after `signal` told the caller that the operation is
    /// done: the end's clock read and stores overlap the caller's turnaround instead of
    /// delaying it. The end is then the moment after the signal. A dump that starts meanwhile
    /// waits for the end to be written, so a caller that saw the completion dumps it
    /// completed.
    pub fn finish_after(
        &mut self,
        rec: &mut OpRecord,
        outcome: Outcome<'_>,
        signal: impl FnOnce(),
    ) {
        if rec.q.id == 0 || !self.on {
            self.anchor = 0;
            signal();
            return;
        }
        self.hold_dumps();
        signal();
        self.finish(rec, outcome);
        self.release_dumps();
    }

    /// Ends an operation whose start was pinned ([`TraceWriter::pin_start`]) and not recorded
    /// yet, because it never waited long: tells the caller (`signal`), reads the end time, and
    /// returns what [`TraceWriter::write_ended`] needs to write the whole record later, when
    /// the thread would only wait anyway (for peers in its next operation, or for work), so
    /// that none of the record's stores delays an operation. Until then a dump waits for it
    /// (up to 20 ms), so a caller that saw the completion dumps it completed. `None` when
    /// there is nothing to write later: nothing is recorded, or a long wait already started
    /// the record, which is finished here as [`TraceWriter::finish_after`] does.
    pub fn end_pinned_after(&mut self, rec: &mut OpRecord, signal: impl FnOnce()) -> Option<Ended> {
        if rec.q.id == 0 || !self.on || rec.slot != NOT_STARTED {
            self.finish_after(rec, Outcome::Completed, signal);
            return None;
        }
        self.hold_dumps();
        signal();
        let now = self.trace.clock.now();
        let started = match std::mem::replace(&mut self.anchor, now) {
            0 => now,
            a => a,
        };
        Some(Ended {
            q: rec.q,
            started,
            ended: now,
        })
    }

    /// Writes the whole record of `ended` (see [`TraceWriter::end_pinned_after`]): `info`
    /// describes the op, which ran over `transport` with `algorithm`.
    pub fn write_ended(
        &mut self,
        ended: Ended,
        info: impl FnOnce() -> OpInfo,
        transport: Option<&'static str>,
        algorithm: Option<&'static str>,
    ) {
        let mut r = self.started_rec(&ended.q, ended.started, info, transport, algorithm);
        r.ended = ended.ended.max(r.started);
        r.state = State::Completed;
        self.push(&r);
        self.bump_started(r.kind, r.seq);
        self.bump_completed(r.kind, r.seq);
        self.release_dumps();
    }

    /// A record whose caller was told is not written yet: dumps wait until it is.
    #[inline]
    fn hold_dumps(&mut self) {
        self.unwritten += 1;
        // Release: seen by whoever acquires what the signal that follows publishes.
        self.trace
            .exec
            .unwritten
            .store(self.unwritten, Ordering::Release);
    }

    /// One record [`TraceWriter::hold_dumps`] announced is written.
    #[inline]
    fn release_dumps(&mut self) {
        self.unwritten -= 1;
        self.trace
            .exec
            .unwritten
            .store(self.unwritten, Ordering::Release);
    }
}

/// Raises the sequence counter of `kind` (collective or p2p; communicator steps have none) to
/// `seq`: the writer's own copy in `mine`, and the shared one in `shared` that dumps read.
fn raise(mine: &mut [u64; 2], shared: [&AtomicU64; 2], kind: RecordKind, seq: u64) {
    let k = seq_index(kind);
    if kind != RecordKind::Comm && seq > mine[k] {
        mine[k] = seq;
        shared[k].store(seq, Ordering::Release);
    }
}

/// An operation that completed and whose record is still to be written (see
/// [`TraceWriter::end_pinned_after`]).
#[derive(Debug)]
#[must_use = "dumps wait until it is written with TraceWriter::write_ended"]
pub struct Ended {
    pub(super) q: Queued,
    pub(super) started: u64,
    pub(super) ended: u64,
}
