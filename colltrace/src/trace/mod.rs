//! The per-communicator ring buffers and the handles the engine updates on its hot path.
//!
//! A record is eleven 64-bit words (names interned as 16-bit codes, see `names`), written in
//! place into a slot guarded by its own sequence number (a seqlock): the writer makes the
//! sequence odd, writes the words, makes it even again; a dump copies the words and retries if
//! the sequence moved. Writing takes no lock and no atomic read-modify-write on the progress
//! thread, and never allocates except for the rare parts (errors, batch peers), which go to a
//! side table keyed by record id.

mod handle;
mod record;
mod slot;
mod snapshot;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{now_ns, Clock};
use crate::names;
use crate::schema::{CommState, PeerTransfer, RecordKind, State};
use crate::waited::follows_last_waited;

use handle::NOT_STARTED;
pub use handle::{OpHandle, OpRecord, Outcome, QueuedOp};
use record::{Extra, Queued, Rec, WORDS};
use slot::Slot;
pub use writer::{Ended, TraceWriter};

/// What the engine knows about an operation when it starts. Fields the operation does not
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
/// Source of [`CommTrace`]'s `uid` (0 is [`Waited::NONE`](crate::Waited::NONE)'s).
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// `Queued::enqueued` of an operation whose enqueue time is its start time (see
/// [`CommTrace::submit`]).
const ENQUEUED_AT_START: u64 = 0;

/// Operations submitted but not yet started that a dump can show (at most the buffer size).
const QUEUED_SLOTS: usize = 1024;

/// A full record of the submitting side's rare events: communicator steps and refusals.
#[derive(Debug, Clone)]
struct Misc {
    rec: Rec,
    extra: Extra,
}

/// Lifecycle of the communicator.
#[derive(Debug)]
struct Status {
    transport: Option<&'static str>,
    state: CommState,
    error: Option<String>,
}

/// What the progress thread writes (through its [`TraceWriter`]): operations from their
/// start on, and the started/completed counters. Read by dumps only.
#[derive(Debug)]
struct ExecSide {
    /// One per buffered record; record `n` (0-based, in start order) lives in `n % len`.
    slots: Box<[Slot<WORDS>]>,
    /// Records started so far.
    count: AtomicU64,
    coll_started: AtomicU64,
    coll_completed: AtomicU64,
    p2p_started: AtomicU64,
    p2p_completed: AtomicU64,
    /// Records whose caller was told they completed and that are not written yet (see
    /// [`TraceWriter::end_pinned_after`]); a dump waits until there are none, so that a caller
    /// who saw its operation complete sees it completed.
    unwritten: AtomicU64,
    /// Errors and batch peers by record id (the newest `capacity`).
    extra: Mutex<BTreeMap<u64, Extra>>,
}

/// The trace of one communicator on one rank: ring buffers of its last operations and its
/// sequence counters.
///
/// Cost on the hot path: the submitting thread takes an id (one atomic add) and, unless it
/// just saw the previous operation complete, a timestamp; after handing the operation over, it
/// shows it as queued (one compare-and-swap and four words). The progress thread, the only
/// writer of the execution side ([`TraceWriter`]), writes eleven words and a counter at the
/// start of an operation and two words and a counter at its end (after its caller was told),
/// with no lock and no read-modify-write; or, for an operation whose start it only pinned, the
/// whole record once, later, where it would only wait ([`TraceWriter::end_pinned_after`]). The
/// two sides are on cache lines of their own. A dump merges both sides by id: an operation the
/// progress thread has not taken yet shows as `queued`.
#[derive(Debug)]
pub struct CommTrace {
    meta: CommMeta,
    capacity: usize,
    /// Whether new operations are recorded: `capacity > 0` unless paused with
    /// [`CommTrace::set_recording`]. Read with one relaxed load per submit, so that a paused
    /// trace costs what a trace of capacity 0 costs.
    recording: AtomicBool,
    created_ns: u64,
    /// Process-unique identity, for [`Waited`].
    uid: u64,
    /// Set while the progress thread may sleep (see [`TraceWriter::park`]): read by every
    /// submission, written only when the thread parks or wakes, so its line stays shared.
    parked: Padded<AtomicBool>,
    /// Time source of the records (TSC ticks or system ns; see the `clock` module).
    clock: Clock,
    /// Next record id (taken by submitting threads without a lock).
    next_id: Padded<AtomicU64>,
    /// Collective and p2p sequence numbers published as queued.
    enqueued: Padded<[AtomicU64; 2]>,
    /// Queued stubs, slot `id % len`, `len` a power of two (written by submitting threads,
    /// claimed per slot).
    queued: Box<[Slot<4>]>,
    misc: Padded<Mutex<VecDeque<Misc>>>,
    comm_seq: AtomicU64,
    exec: Padded<ExecSide>,
    writer_taken: AtomicBool,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn seq_index(kind: RecordKind) -> usize {
    usize::from(kind == RecordKind::P2p)
}

impl CommTrace {
    /// A trace keeping the last `capacity` operations (0: tracing off), registered so that
    /// dumps include it. Its slots are allocated now (about 100 bytes per record).
    pub fn new(meta: CommMeta, capacity: usize) -> Arc<CommTrace> {
        let t = Arc::new(CommTrace {
            meta,
            capacity,
            recording: AtomicBool::new(capacity > 0),
            created_ns: now_ns(),
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            parked: Padded(AtomicBool::new(false)),
            clock: Clock::current(),
            next_id: Padded(AtomicU64::new(1)),
            enqueued: Padded([AtomicU64::new(0), AtomicU64::new(0)]),
            queued: (0..capacity.min(QUEUED_SLOTS).next_power_of_two())
                .map(|_| Slot::default())
                .collect(),
            misc: Padded(Mutex::new(VecDeque::new())),
            comm_seq: AtomicU64::new(0),
            exec: Padded(ExecSide {
                slots: (0..capacity).map(|_| Slot::default()).collect(),
                count: AtomicU64::new(0),
                coll_started: AtomicU64::new(0),
                coll_completed: AtomicU64::new(0),
                p2p_started: AtomicU64::new(0),
                p2p_completed: AtomicU64::new(0),
                unwritten: AtomicU64::new(0),
                extra: Mutex::new(BTreeMap::new()),
            }),
            writer_taken: AtomicBool::new(false),
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

    /// The writer of started and finished operations, for the progress thread. There is one
    /// per trace: a second call returns a writer that records nothing (and logs why).
    pub fn writer(self: &Arc<Self>) -> TraceWriter {
        let first = !self.writer_taken.swap(true, Ordering::AcqRel);
        if !first && self.capacity > 0 {
            tracing::warn!(
                comm = %self.meta.name,
                "colltrace: a second writer was asked for; it records nothing"
            );
        }
        TraceWriter {
            trace: Arc::clone(self),
            on: first && self.capacity > 0,
            count: 0,
            next: 0,
            anchor: 0,
            parked: false,
            unwritten: 0,
            started: [0; 2],
            completed: [0; 2],
        }
    }

    /// Identity of the communicator.
    pub fn meta(&self) -> &CommMeta {
        &self.meta
    }

    /// True when the trace has a buffer (`TORCHCOMMS_TRACE_BUFFER_SIZE` > 0), also while
    /// recording is paused: what it holds can still be dumped.
    pub fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Pauses (`false`) or resumes (`true`) recording of new operations, at run time, for
    /// measuring what tracing costs within one process (`torchcomms-perf --trace-ab`). It
    /// acts at [`CommTrace::submit`] and [`CommTrace::begin_comm_op`]: an operation submitted
    /// while paused is not recorded at all (not even counted in the sequence counters, which
    /// stay at the last recorded operation), one submitted before is recorded to its end. A
    /// paused trace costs one relaxed load and a branch per operation, as a trace of
    /// capacity 0 does. No effect on a trace of capacity 0, which never records.
    pub fn set_recording(&self, on: bool) {
        self.recording
            .store(on && self.capacity > 0, Ordering::Relaxed);
    }

    /// True when new operations are recorded (see [`CommTrace::set_recording`]).
    pub fn is_recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// Operations and communicator steps recorded since the trace was created (including the
    /// ones that left the ring since), for checking that recording is on or paused.
    pub fn recorded(&self) -> u64 {
        self.next_id.load(Ordering::Relaxed).saturating_sub(1)
    }

    /// Records a submitted operation `op` with sequence number `seq` (collective or p2p, as
    /// `p2p` says). The progress thread passes the returned record to [`TraceWriter::start`]
    /// and [`TraceWriter::finish`]; the submitting thread passes [`OpRecord::queued`] to
    /// [`CommTrace::publish`] once the operation is on its way (off the critical path), so
    /// that dumps show it queued until it starts.
    ///
    /// When this thread saw the previous operation complete ([`Waited::note`]) and the
    /// progress thread is awake, nothing is queued ahead: the operation is recorded as
    /// enqueued when it starts, submitting reads no clock, and publishing does nothing.
    ///
    /// Callers submit to one trace one at a time (the communicator's submitter lock), in
    /// `seq` order per kind: the count of submitted operations is kept here with a plain store.
    #[inline]
    pub fn submit(
        &self,
        p2p: bool,
        seq: u64,
        op: &'static str,
        async_op: Option<bool>,
        timeout: Duration,
    ) -> OpRecord {
        if !self.recording.load(Ordering::Relaxed) {
            return OpRecord::NONE;
        }
        let kind = if p2p {
            RecordKind::P2p
        } else {
            RecordKind::Collective
        };
        // Predicted from a plain load, so that an operation that needs the clock reads it
        // before the atomic add (after it, the read waits for the add: about 12 ns more);
        // confirmed with the id actually taken.
        let at_start = !self.parked.load(Ordering::Relaxed)
            && follows_last_waited(self.uid, self.next_id.load(Ordering::Relaxed));
        let mut enqueued = if at_start {
            ENQUEUED_AT_START
        } else {
            self.clock.now()
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if at_start && !follows_last_waited(self.uid, id) {
            // Another thread submitted in between: this one may queue behind it.
            enqueued = self.clock.now();
        }
        let submitted = &self.enqueued[seq_index(kind)];
        if seq > submitted.load(Ordering::Relaxed) {
            submitted.store(seq, Ordering::Relaxed);
        }
        let q = Queued {
            id,
            seq,
            enqueued,
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            op: names::code(op),
            kind,
            async_op,
        };
        OpRecord {
            q,
            slot: NOT_STARTED,
        }
    }

    /// Shows a submitted operation as queued (see [`CommTrace::submit`]); harmless after it
    /// started or finished (the progress thread's record wins in dumps).
    ///
    /// An operation enqueued at its start is not shown: an awake progress thread with nothing
    /// ahead of it picks it up within a poll, and its record appears there. Writing the stub
    /// anyway measured 0.4% of a 4-rank 8 B all_reduce (`docs/perf/colltrace.md`), though it
    /// runs after the hand-over.
    pub fn publish(&self, queued: QueuedOp) {
        let q = queued.0;
        if q.id == 0 || q.enqueued == ENQUEUED_AT_START {
            return;
        }
        let slot = &self.queued[(q.id as usize) & (self.queued.len() - 1)];
        // Another thread writing the same slot holds a newer or older stub of an operation
        // `len` ids away; losing this stub only hides a queued state that a dump would show.
        if let Some(s) = slot.claim() {
            // Word 0 of a packed stub is its id.
            if slot.own_word(0) < q.id {
                slot.write_claimed(s, q.pack());
            } else {
                slot.seq.store(s.wrapping_add(1), Ordering::Release);
            }
        }
    }

    /// Records that a submitted operation was refused before it reached the progress thread.
    pub fn refuse(&self, rec: OpRecord, err: &dyn std::fmt::Display) {
        if rec.q.id == 0 {
            return;
        }
        let now = self.clock.now();
        let mut r = Rec::queued_until(&rec.q, now);
        r.state = State::Failed;
        r.ended = now;
        let extra = Extra {
            error: Some(err.to_string().into_boxed_str()),
            ..Extra::default()
        };
        self.push_misc(Misc { rec: r, extra });
    }

    /// Records a submitted operation that completed on the submitting thread, never reaching
    /// the progress thread: a collective that moves nothing, with nothing before it unfinished.
    pub fn complete_inline(&self, rec: OpRecord) {
        if rec.q.id == 0 {
            return;
        }
        let now = self.clock.now();
        let mut r = Rec::queued_until(&rec.q, now);
        r.started = now;
        r.ended = now;
        r.state = State::Completed;
        self.push_misc(Misc {
            rec: r,
            extra: Extra::default(),
        });
    }

    fn push_misc(&self, m: Misc) {
        let mut g = lock(&self.misc);
        if g.len() >= self.capacity {
            g.pop_front();
        }
        g.push_back(m);
    }

    /// Records a communicator-level step (`init`, `split`), started now.
    pub fn begin_comm_op(
        self: &Arc<Self>,
        op: &'static str,
        timeout: Duration,
        detail: Option<String>,
    ) -> OpHandle {
        if !self.recording.load(Ordering::Relaxed) {
            return OpHandle::NONE;
        }
        let now = self.clock.now();
        let seq = self.comm_seq.fetch_add(1, Ordering::Relaxed) + 1;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let q = Queued {
            id,
            seq,
            enqueued: now,
            timeout_ms: u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX),
            op: names::code(op),
            kind: RecordKind::Comm,
            async_op: None,
        };
        let mut rec = Rec::queued(&q);
        rec.state = State::Started;
        rec.started = now;
        let extra = Extra {
            detail: detail.map(String::into_boxed_str),
            ..Extra::default()
        };
        self.push_misc(Misc { rec, extra });
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
}
