//! The per-communicator ring buffer and the handles the engine updates on its hot path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{now_ns, Clock};
use crate::schema::{CommDump, CommState, PeerTransfer, Record, RecordKind, SeqCounters, State};

/// What the engine knows about an operation when it is submitted. Fields the operation does not
/// have stay at their default.
#[derive(Debug, Clone, Default)]
pub struct OpInfo {
    /// Operation name (`all_reduce`, `send`, ...).
    pub op: &'static str,
    /// Element type name, when known.
    pub dtype: Option<&'static str>,
    /// Elements every rank must agree on, when the element type is known.
    pub count: Option<u64>,
    /// Bytes this rank contributes.
    pub in_bytes: u64,
    /// Bytes this rank receives.
    pub out_bytes: u64,
    /// Root of a rooted collective (communicator rank).
    pub root: Option<usize>,
    /// Peer of a send or receive (communicator rank).
    pub peer: Option<usize>,
    /// Transfers of a batch.
    pub peers: Vec<PeerTransfer>,
    /// Reduction name.
    pub reduce_op: Option<&'static str>,
    /// Whether the caller issued it asynchronously, if the caller said.
    pub async_op: Option<bool>,
    /// Deadline after the start.
    pub timeout: Duration,
}

/// Identity of a communicator in traces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommMeta {
    /// Name given at creation.
    pub name: String,
    /// Instance of this name on this rank (see [`CommDump::instance`]).
    pub instance: u64,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub size: usize,
    /// Global rank of every member.
    pub global_ranks: Vec<usize>,
}

impl CommMeta {
    /// Global rank of this member.
    pub fn global_rank(&self) -> usize {
        self.global_ranks
            .get(self.rank)
            .copied()
            .unwrap_or(self.rank)
    }
}

/// An operation as kept in memory: no allocation unless it is a batch, failed, or a split.
#[derive(Debug, Clone)]
struct Live {
    id: u64,
    kind: RecordKind,
    seq: u64,
    op: &'static str,
    dtype: Option<&'static str>,
    count: Option<u64>,
    in_bytes: u64,
    out_bytes: u64,
    root: Option<u32>,
    peer: Option<u32>,
    peers: Option<Box<[PeerTransfer]>>,
    reduce_op: Option<&'static str>,
    async_op: Option<bool>,
    algorithm: Option<&'static str>,
    transport: Option<&'static str>,
    timeout_ms: u64,
    state: State,
    enqueued_ns: u64,
    started_ns: u64,
    ended_ns: u64,
    error: Option<Box<str>>,
    detail: Option<Box<str>>,
}

impl Live {
    fn to_record(&self, clock: Clock) -> Record {
        Record {
            id: self.id,
            kind: self.kind,
            seq: self.seq,
            op: self.op.into(),
            dtype: self.dtype.map(Into::into),
            count: self.count,
            in_bytes: self.in_bytes,
            out_bytes: self.out_bytes,
            root: self.root.map(|r| r as usize),
            peer: self.peer.map(|p| p as usize),
            peers: self.peers.as_ref().map(|p| p.to_vec()),
            reduce_op: self.reduce_op.map(Into::into),
            async_op: self.async_op,
            algorithm: self.algorithm.map(Into::into),
            transport: self.transport.map(Into::into),
            timeout_ms: self.timeout_ms,
            state: self.state,
            enqueued_ns: clock.to_ns(self.enqueued_ns),
            started_ns: clock.to_ns(self.started_ns),
            ended_ns: clock.to_ns(self.ended_ns),
            error: self.error.as_deref().map(Into::into),
            detail: self.detail.as_deref().map(Into::into),
        }
    }
}

/// A bounded run of records in id order: a ring of slots overwritten in place.
#[derive(Debug, Default)]
struct Ring {
    slots: Vec<Live>,
    /// Index of the oldest slot once the ring is full.
    head: usize,
}

impl Ring {
    fn push(&mut self, cap: usize, r: Live) {
        if self.slots.len() < cap {
            self.slots.push(r);
        } else if cap > 0 {
            self.slots[self.head] = r;
            self.head = (self.head + 1) % cap;
        }
    }

    /// The slot of the `i`-th oldest record.
    fn at(&self, i: usize) -> usize {
        (self.head + i) % self.slots.len()
    }

    fn get(&mut self, id: u64) -> Option<&mut Live> {
        let n = self.slots.len();
        // Usually the newest record (collectives run one at a time, in order).
        let newest = self.at(n.checked_sub(1)?);
        if self.slots[newest].id == id {
            return self.slots.get_mut(newest);
        }
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let m = self.slots[self.at(mid)].id;
            if m == id {
                let k = self.at(mid);
                return self.slots.get_mut(k);
            }
            if m < id {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        None
    }

    fn iter(&self) -> impl Iterator<Item = &Live> {
        (0..self.slots.len()).map(|i| &self.slots[self.at(i)])
    }
}

/// Operations submitted but not yet started that a dump can show (at most the buffer size).
const QUEUED_SLOTS: usize = 1024;

/// A submitted operation as the submitting thread records it: small, fixed size, written in
/// place (one cache line).
#[derive(Debug, Clone, Copy, Default)]
struct Queued {
    id: u64,
    seq: u64,
    enqueued_ns: u64,
    op: &'static str,
    timeout_ms: u32,
    kind: RecordKind,
    async_op: Option<bool>,
    refused: bool,
}

/// What the submitting threads write: queued operations (slot `id % capacity`), ids,
/// communicator steps and refusals (rare, full records).
#[derive(Debug)]
struct SubmitSide {
    queued: Vec<Queued>,
    misc: Ring,
    coll_enqueued: u64,
    p2p_enqueued: u64,
    comm_seq: u64,
}

/// What the progress thread writes: operations from their start on.
#[derive(Debug, Default)]
struct ExecSide {
    ring: Ring,
    coll_started: u64,
    coll_completed: u64,
    p2p_started: u64,
    p2p_completed: u64,
}

impl ExecSide {
    fn started(&mut self, kind: RecordKind, seq: u64) {
        match kind {
            RecordKind::Collective => self.coll_started = self.coll_started.max(seq),
            RecordKind::P2p => self.p2p_started = self.p2p_started.max(seq),
            RecordKind::Comm => {}
        }
    }

    fn completed(&mut self, kind: RecordKind, seq: u64) {
        match kind {
            RecordKind::Collective => self.coll_completed = self.coll_completed.max(seq),
            RecordKind::P2p => self.p2p_completed = self.p2p_completed.max(seq),
            RecordKind::Comm => {}
        }
    }
}

/// Lifecycle of the communicator.
#[derive(Debug)]
struct Status {
    transport: Option<&'static str>,
    state: CommState,
    error: Option<String>,
}

/// The trace of one communicator on one rank: ring buffers of its last operations and its
/// sequence counters.
///
/// Cost on the hot path: submitting threads only write the submission side and the progress
/// thread only writes the execution side, each behind its own lock that nobody else takes
/// except a dump; so no cache line moves between the caller's core and the progress thread's
/// for tracing (the task carrying its [`OpRecord`] moves anyway). A dump merges both sides by
/// id: an operation the progress thread has not taken yet shows as `queued`.
#[derive(Debug)]
pub struct CommTrace {
    meta: CommMeta,
    capacity: usize,
    created_ns: u64,
    /// Time source of the records (TSC ticks or system ns; see the `clock` module).
    clock: Clock,
    // Each side on cache lines of its own: the submitting thread's core and the progress
    // thread's core never write the same line.
    /// Next record id (taken by submitting threads without a lock).
    next_id: Padded<AtomicU64>,
    submit: Padded<Mutex<SubmitSide>>,
    exec: Padded<Mutex<ExecSide>>,
    status: Padded<Mutex<Status>>,
}

/// Aligns its content to 128 bytes (two cache lines, for adjacent-line prefetching).
#[derive(Debug)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// How an operation ended.
#[derive(Clone, Copy)]
pub enum Outcome<'a> {
    /// Successfully.
    Completed,
    /// With an error.
    Failed(&'a dyn std::fmt::Display),
    /// Past its deadline.
    TimedOut(&'a dyn std::fmt::Display),
}

impl std::fmt::Debug for Outcome<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Completed => f.write_str("Completed"),
            Outcome::Failed(e) => write!(f, "Failed({e})"),
            Outcome::TimedOut(e) => write!(f, "TimedOut({e})"),
        }
    }
}

impl Outcome<'_> {
    fn parts(self) -> (State, Option<Box<str>>) {
        match self {
            Outcome::Completed => (State::Completed, None),
            Outcome::Failed(e) => (State::Failed, Some(e.to_string().into_boxed_str())),
            Outcome::TimedOut(e) => (State::TimedOut, Some(e.to_string().into_boxed_str())),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn live(
    id: u64,
    kind: RecordKind,
    seq: u64,
    info: OpInfo,
    now: u64,
    detail: Option<String>,
) -> Live {
    Live {
        id,
        kind,
        seq,
        op: info.op,
        dtype: info.dtype,
        count: info.count,
        in_bytes: info.in_bytes,
        out_bytes: info.out_bytes,
        root: info.root.map(|r| r as u32),
        peer: info.peer.map(|p| p as u32),
        peers: (!info.peers.is_empty()).then(|| info.peers.into_boxed_slice()),
        reduce_op: info.reduce_op,
        async_op: info.async_op,
        algorithm: None,
        transport: None,
        timeout_ms: u64::try_from(info.timeout.as_millis()).unwrap_or(u64::MAX),
        state: State::Queued,
        enqueued_ns: now,
        started_ns: 0,
        ended_ns: 0,
        error: None,
        detail: detail.map(String::into_boxed_str),
    }
}

impl CommTrace {
    /// A trace keeping the last `capacity` operations (0: tracing off), registered so that
    /// dumps include it.
    pub fn new(meta: CommMeta, capacity: usize) -> Arc<CommTrace> {
        let t = Arc::new(CommTrace {
            meta,
            capacity,
            created_ns: now_ns(),
            clock: Clock::current(),
            next_id: Padded(AtomicU64::new(1)),
            submit: Padded(Mutex::new(SubmitSide {
                queued: vec![Queued::default(); capacity.min(QUEUED_SLOTS)],
                misc: Ring::default(),
                coll_enqueued: 0,
                p2p_enqueued: 0,
                comm_seq: 0,
            })),
            exec: Padded(Mutex::new(ExecSide::default())),
            status: Padded(Mutex::new(Status {
                transport: None,
                state: CommState::Joining,
                error: None,
            })),
        });
        if capacity > 0 {
            crate::registry::register(&t);
        }
        t
    }

    /// Identity of the communicator.
    pub fn meta(&self) -> &CommMeta {
        &self.meta
    }

    /// True when operations are recorded.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Records a submitted operation `op` with sequence number `seq` (collective or p2p, as
    /// `p2p` says). The progress thread passes the returned record to [`CommTrace::start`] and
    /// [`CommTrace::finish`]; the submitting thread passes [`OpRecord::queued`] to
    /// [`CommTrace::publish`] once the operation is on its way (off the critical path), so that
    /// dumps show it queued until it starts. Call it in submission order (the engine holds its
    /// submission lock).
    pub fn submit(
        &self,
        p2p: bool,
        seq: u64,
        op: &'static str,
        async_op: Option<bool>,
        timeout: Duration,
    ) -> OpRecord {
        if self.capacity == 0 {
            return OpRecord::NONE;
        }
        let kind = if p2p {
            RecordKind::P2p
        } else {
            RecordKind::Collective
        };
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let now = self.clock.now();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let q = Queued {
            id,
            seq,
            enqueued_ns: now,
            op,
            timeout_ms,
            kind,
            async_op,
            refused: false,
        };
        OpRecord { q, started: false }
    }

    /// Shows a submitted operation as queued (see [`CommTrace::submit`]); harmless after it
    /// started or finished (the progress thread's record wins in dumps).
    pub fn publish(&self, queued: QueuedOp) {
        let q = queued.0;
        if q.id == 0 {
            return;
        }
        let mut g = lock(&self.submit);
        match q.kind {
            RecordKind::P2p => g.p2p_enqueued = g.p2p_enqueued.max(q.seq),
            _ => g.coll_enqueued = g.coll_enqueued.max(q.seq),
        }
        let slot = (q.id % g.queued.len() as u64) as usize;
        if g.queued[slot].id < q.id {
            g.queued[slot] = q;
        }
    }

    /// Records that a submitted operation was refused before it reached the progress thread.
    pub fn refuse(&self, rec: OpRecord, err: &dyn std::fmt::Display) {
        if rec.q.id == 0 {
            return;
        }
        let now = self.clock.now();
        let mut r = rec.stub();
        r.state = State::Failed;
        r.ended_ns = now;
        r.error = Some(err.to_string().into_boxed_str());
        let mut g = lock(&self.submit);
        let slot = (rec.q.id % g.queued.len() as u64) as usize;
        if g.queued[slot].id == rec.q.id {
            g.queued[slot].refused = true;
        }
        g.misc.push(self.capacity, r);
    }

    /// The progress thread started `rec` over `transport` with `algorithm`; `info` describes
    /// the op (computed on the progress thread, so the caller's path and the task crossing
    /// threads stay small). Calling it again for the same record only updates the algorithm.
    pub fn start(
        &self,
        rec: &mut OpRecord,
        info: impl FnOnce() -> OpInfo,
        transport: Option<&'static str>,
        algorithm: Option<&'static str>,
    ) {
        if rec.q.id == 0 {
            return;
        }
        let now = self.clock.now();
        if rec.started {
            let mut g = lock(&self.exec);
            if let Some(r) = g.ring.get(rec.q.id) {
                r.algorithm = algorithm.or(r.algorithm);
            }
            return;
        }
        rec.started = true;
        let mut info = info();
        info.async_op = rec.q.async_op;
        info.op = rec.q.op;
        let mut r = live(
            rec.q.id,
            rec.q.kind,
            rec.q.seq,
            info,
            rec.q.enqueued_ns,
            None,
        );
        r.timeout_ms = u64::from(rec.q.timeout_ms);
        r.state = State::Started;
        r.started_ns = now;
        r.transport = transport;
        r.algorithm = algorithm;
        let mut g = lock(&self.exec);
        g.started(rec.q.kind, rec.q.seq);
        g.ring.push(self.capacity, r);
    }

    /// The progress thread finished `rec` (also when it never started it). The first end
    /// recorded wins.
    pub fn finish(&self, rec: &mut OpRecord, outcome: Outcome<'_>) {
        if rec.q.id == 0 {
            return;
        }
        let now = self.clock.now();
        let (state, error) = outcome.parts();
        let mut g = lock(&self.exec);
        if !rec.started {
            rec.started = true;
            g.ring.push(self.capacity, rec.stub());
        }
        let Some(r) = g.ring.get(rec.q.id) else {
            return;
        };
        if r.state.is_final() {
            return;
        }
        if r.started_ns == 0 {
            r.started_ns = now;
        }
        r.state = state;
        r.ended_ns = now;
        r.error = error;
        if state == State::Completed {
            g.completed(rec.q.kind, rec.q.seq);
        }
    }

    /// Records a communicator-level step (`init`, `split`), started now.
    pub fn begin_comm_op(
        self: &Arc<Self>,
        op: &'static str,
        timeout: Duration,
        detail: Option<String>,
    ) -> OpHandle {
        if self.capacity == 0 {
            return OpHandle::NONE;
        }
        let info = OpInfo {
            op,
            timeout,
            ..OpInfo::default()
        };
        let now = self.clock.now();
        let mut g = lock(&self.submit);
        g.comm_seq += 1;
        let seq = g.comm_seq;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut r = live(id, RecordKind::Comm, seq, info, now, detail);
        r.state = State::Started;
        r.started_ns = now;
        g.misc.push(self.capacity, r);
        OpHandle {
            trace: Some(Arc::clone(self)),
            id,
        }
    }

    /// Records which transports the communicator uses, and that it is connected.
    pub fn set_connected(&self, transport: &'static str) {
        let mut g = lock(&self.status);
        g.transport = Some(transport);
        if g.state == CommState::Joining {
            g.state = CommState::Active;
        }
    }

    /// Records a lifecycle change; `error` is kept when it is the first.
    pub fn set_state(&self, state: CommState, error: Option<String>) {
        let mut g = lock(&self.status);
        // A failure or abort is final; finalizing a failed communicator keeps the failure.
        if matches!(g.state, CommState::Failed | CommState::Aborted)
            && state == CommState::Finalized
        {
            return;
        }
        g.state = state;
        if g.error.is_none() {
            g.error = error;
        }
    }

    /// The state of the communicator, as recorded.
    pub fn state(&self) -> CommState {
        lock(&self.status).state
    }

    /// A copy of everything, for a dump.
    pub fn snapshot(&self) -> CommDump {
        let clock = self.clock;
        clock.refresh();
        // Execution side first: an operation that moves from queued to started in between
        // shows as queued, never twice.
        let (exec, coll_started, coll_completed, p2p_started, p2p_completed) = {
            let g = lock(&self.exec);
            let recs: Vec<Record> = g.ring.iter().map(|r| r.to_record(clock)).collect();
            (
                recs,
                g.coll_started,
                g.coll_completed,
                g.p2p_started,
                g.p2p_completed,
            )
        };
        let (queued, misc, next_id, coll_enqueued, p2p_enqueued) = {
            let g = lock(&self.submit);
            let misc: Vec<Record> = g.misc.iter().map(|r| r.to_record(clock)).collect();
            let queued: Vec<Queued> = g.queued.iter().filter(|q| q.id > 0).copied().collect();
            let next_id = self.next_id.load(Ordering::Relaxed);
            (queued, misc, next_id, g.coll_enqueued, g.p2p_enqueued)
        };
        // Precedence: the progress thread's record, then full records of the submitting side
        // (communicator steps, refusals), then the queued stub.
        let mut by_id: std::collections::BTreeMap<u64, Record> = BTreeMap::new();
        for q in queued.iter().filter(|q| !q.refused) {
            let stub = OpRecord {
                q: *q,
                started: false,
            };
            by_id.insert(q.id, stub.stub().to_record(clock));
        }
        for r in misc.into_iter().chain(exec) {
            by_id.insert(r.id, r);
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
            dropped: (next_id - 1).saturating_sub(records.len() as u64),
            created_ns: self.created_ns,
            collective: SeqCounters {
                enqueued: coll_enqueued.max(coll_started).max(coll_completed),
                started: coll_started,
                completed: coll_completed,
            },
            p2p: SeqCounters {
                enqueued: p2p_enqueued.max(p2p_started).max(p2p_completed),
                started: p2p_started,
                completed: p2p_completed,
            },
            records,
        }
    }
}

/// A submitted operation on its way through the progress thread (see [`CommTrace::submit`]).
/// Small and free of references to the trace, so the task that carries it across threads stays
/// small.
#[derive(Debug, Default)]
pub struct OpRecord {
    q: Queued,
    started: bool,
}

impl OpRecord {
    /// A record of nothing (tracing off).
    pub const NONE: OpRecord = OpRecord {
        q: Queued {
            id: 0,
            seq: 0,
            enqueued_ns: 0,
            op: "",
            timeout_ms: 0,
            kind: RecordKind::Collective,
            async_op: None,
            refused: false,
        },
        started: false,
    };

    /// What [`CommTrace::publish`] needs, copied out before the record moves to the progress
    /// thread.
    pub fn queued(&self) -> QueuedOp {
        QueuedOp(self.q)
    }

    /// A record with only what the submitting thread knew.
    fn stub(&self) -> Live {
        let q = &self.q;
        let info = OpInfo {
            op: q.op,
            async_op: q.async_op,
            timeout: Duration::from_millis(u64::from(q.timeout_ms)),
            ..OpInfo::default()
        };
        live(q.id, q.kind, q.seq, info, q.enqueued_ns, None)
    }
}

/// A submitted operation as [`CommTrace::publish`] records it (a small copy).
#[derive(Debug, Clone, Copy)]
pub struct QueuedOp(Queued);

/// A handle to a communicator-level step (`init`, `split`), which the calling thread ends.
#[derive(Debug, Default)]
pub struct OpHandle {
    trace: Option<Arc<CommTrace>>,
    id: u64,
}

impl OpHandle {
    /// A handle that records nothing.
    pub const NONE: OpHandle = OpHandle { trace: None, id: 0 };

    /// The step finished; the first end recorded wins.
    pub fn finish(&self, outcome: Outcome<'_>) {
        let Some(t) = &self.trace else { return };
        let now = t.clock.now();
        let (state, error) = outcome.parts();
        let mut g = lock(&t.submit);
        let Some(r) = g.misc.get(self.id) else { return };
        if r.state.is_final() {
            return;
        }
        r.state = state;
        r.ended_ns = now;
        r.error = error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CommMeta {
        CommMeta {
            name: "unit".into(),
            instance: 1,
            rank: 1,
            size: 2,
            global_ranks: vec![4, 5],
        }
    }

    fn info(op: &'static str) -> OpInfo {
        OpInfo {
            op,
            ..OpInfo::default()
        }
    }

    #[test]
    fn records_move_through_states_and_counters() {
        let t = CommTrace::new(meta(), 3);
        assert_eq!(t.meta().global_rank(), 5);
        let sub = |p2p, seq, op| t.submit(p2p, seq, op, Some(false), Duration::from_secs(1));
        let mut a = sub(false, 1, "all_reduce");
        let mut b = sub(true, 1, "send");
        let c = sub(false, 2, "barrier");
        for r in [&a, &b, &c] {
            t.publish(r.queued());
        }
        let d = t.snapshot();
        assert!(d.records.iter().all(|r| r.state == State::Queued));
        assert_eq!(
            d.collective,
            SeqCounters {
                enqueued: 2,
                started: 0,
                completed: 0
            }
        );
        t.start(&mut a, || info("all_reduce"), Some("shm"), None);
        t.start(&mut a, || info("all_reduce"), Some("shm"), Some("ring"));
        t.finish(&mut a, Outcome::Completed);
        t.start(&mut b, || info("send"), Some("socket"), None);
        t.finish(&mut b, Outcome::TimedOut(&"too slow"));
        t.finish(&mut b, Outcome::Completed);
        t.refuse(c, &"comm failed");
        let d = t.snapshot();
        assert_eq!(
            d.collective,
            SeqCounters {
                enqueued: 2,
                started: 1,
                completed: 1
            }
        );
        assert_eq!(
            d.p2p,
            SeqCounters {
                enqueued: 1,
                started: 1,
                completed: 0
            }
        );
        assert_eq!(d.records[0].algorithm.as_deref(), Some("ring"));
        assert_eq!(d.records[0].state, State::Completed);
        assert_eq!(d.records[1].state, State::TimedOut);
        assert_eq!(d.records[1].error.as_deref(), Some("too slow"));
        assert_eq!(d.records[2].state, State::Failed);
        // The ring keeps the last 3.
        for s in 3..7 {
            let mut r = sub(false, s, "barrier");
            t.finish(&mut r, Outcome::Completed);
        }
        let d = t.snapshot();
        assert_eq!(d.records.len(), 3);
        assert_eq!(d.dropped, 4);
        assert_eq!(d.records[0].seq, 4);
        assert!(d.records.iter().all(|r| r.state == State::Completed));
        assert_eq!(d.collective.enqueued, 6);
        assert_eq!(d.collective.completed, 6);
    }

    #[test]
    fn comm_steps_have_their_own_sequence() {
        let t = CommTrace::new(meta(), 8);
        let h = t.begin_comm_op("init", Duration::from_secs(1), None);
        h.finish(Outcome::Completed);
        let h = t.begin_comm_op("split", Duration::from_secs(1), Some("child".into()));
        h.finish(Outcome::Failed(&"no"));
        let d = t.snapshot();
        assert_eq!(d.records[0].seq, 1);
        assert_eq!((d.records[1].seq, d.records[1].state), (2, State::Failed));
        assert_eq!(d.records[1].detail.as_deref(), Some("child"));
    }

    #[test]
    fn capacity_zero_records_nothing() {
        let t = CommTrace::new(meta(), 0);
        let mut h = t.submit(false, 1, "x", None, Duration::ZERO);
        t.start(&mut h, OpInfo::default, None, None);
        t.finish(&mut h, Outcome::Completed);
        assert!(t.snapshot().records.is_empty());
    }
}
