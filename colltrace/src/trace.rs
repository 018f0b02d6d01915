//! The per-communicator ring buffers and the handles the engine updates on its hot path.
//!
//! A record is eleven 64-bit words (names interned as 16-bit codes, see `names`), written in
//! place into a slot guarded by its own sequence number (a seqlock): the writer makes the
//! sequence odd, writes the words, makes it even again; a dump copies the words and retries if
//! the sequence moved. Writing takes no lock and no atomic read-modify-write on the progress
//! thread, and never allocates except for the rare parts (errors, batch peers), which go to a
//! side table keyed by record id.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{now_ns, Clock};
use crate::names;
use crate::schema::{CommDump, CommState, PeerTransfer, Record, RecordKind, SeqCounters, State};
use crate::waited::{follows_last_waited, Waited};

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

/// "No count" in a packed record.
const NO_COUNT: u64 = u64::MAX;
/// "No rank" in a packed record.
const NO_RANK: u32 = u32::MAX;

fn kind_code(k: RecordKind) -> u64 {
    match k {
        RecordKind::Collective => 0,
        RecordKind::P2p => 1,
        RecordKind::Comm => 2,
    }
}

fn kind_of(c: u64) -> RecordKind {
    match c {
        1 => RecordKind::P2p,
        2 => RecordKind::Comm,
        _ => RecordKind::Collective,
    }
}

fn state_code(s: State) -> u64 {
    match s {
        State::Queued => 0,
        State::Started => 1,
        State::Completed => 2,
        State::Failed => 3,
        State::TimedOut => 4,
    }
}

fn state_of(c: u64) -> State {
    match c {
        1 => State::Started,
        2 => State::Completed,
        3 => State::Failed,
        4 => State::TimedOut,
        _ => State::Queued,
    }
}

fn async_code(a: Option<bool>) -> u64 {
    match a {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    }
}

fn async_of(c: u64) -> Option<bool> {
    match c {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}

fn rank_code(r: Option<usize>) -> u32 {
    r.and_then(|r| u32::try_from(r).ok()).unwrap_or(NO_RANK)
}

fn rank_of(r: u32) -> Option<usize> {
    (r != NO_RANK).then_some(r as usize)
}

/// Words of a packed record.
const WORDS: usize = 11;
/// Word of a packed record holding the end time.
const ENDED_WORD: usize = 4;
/// Word of a packed record holding the transport, kind, state, async flag and timeout.
const FLAGS_WORD: usize = 10;
/// Position of the state (3 bits) in [`FLAGS_WORD`].
const STATE_SHIFT: u32 = 18;

/// One operation, fixed size, names as codes; timestamps in the trace's clock unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rec {
    id: u64,
    seq: u64,
    enqueued: u64,
    started: u64,
    ended: u64,
    count: u64,
    in_bytes: u64,
    out_bytes: u64,
    root: u32,
    peer: u32,
    timeout_ms: u32,
    op: u16,
    dtype: u16,
    reduce_op: u16,
    algorithm: u16,
    transport: u16,
    kind: RecordKind,
    state: State,
    async_op: Option<bool>,
}

impl Rec {
    /// What the submitting thread knows.
    fn queued(q: &Queued) -> Rec {
        Rec {
            id: q.id,
            seq: q.seq,
            enqueued: q.enqueued,
            started: 0,
            ended: 0,
            count: NO_COUNT,
            in_bytes: 0,
            out_bytes: 0,
            root: NO_RANK,
            peer: NO_RANK,
            timeout_ms: q.timeout_ms,
            op: q.op,
            dtype: names::NONE,
            reduce_op: names::NONE,
            algorithm: names::NONE,
            transport: names::NONE,
            kind: q.kind,
            state: State::Queued,
            async_op: q.async_op,
        }
    }

    /// [`Rec::queued`] of an operation that never started and is recorded at `now`: an
    /// enqueue time deferred to its start becomes `now`.
    fn queued_until(q: &Queued, now: u64) -> Rec {
        let mut r = Rec::queued(q);
        if r.enqueued == ENQUEUED_AT_START {
            r.enqueued = now;
        }
        r
    }

    fn pack(&self) -> [u64; WORDS] {
        [
            self.id,
            self.seq,
            self.enqueued,
            self.started,
            self.ended,
            self.count,
            self.in_bytes,
            self.out_bytes,
            u64::from(self.root) | u64::from(self.peer) << 32,
            u64::from(self.op)
                | u64::from(self.dtype) << 16
                | u64::from(self.reduce_op) << 32
                | u64::from(self.algorithm) << 48,
            u64::from(self.transport)
                | kind_code(self.kind) << 16
                | state_code(self.state) << STATE_SHIFT
                | async_code(self.async_op) << 21
                | u64::from(self.timeout_ms) << 32,
        ]
    }

    fn unpack(w: [u64; WORDS]) -> Rec {
        Rec {
            id: w[0],
            seq: w[1],
            enqueued: w[2],
            started: w[3],
            ended: w[ENDED_WORD],
            count: w[5],
            in_bytes: w[6],
            out_bytes: w[7],
            root: w[8] as u32,
            peer: (w[8] >> 32) as u32,
            op: w[9] as u16,
            dtype: (w[9] >> 16) as u16,
            reduce_op: (w[9] >> 32) as u16,
            algorithm: (w[9] >> 48) as u16,
            transport: w[FLAGS_WORD] as u16,
            kind: kind_of((w[FLAGS_WORD] >> 16) & 3),
            state: state_of((w[FLAGS_WORD] >> STATE_SHIFT) & 7),
            async_op: async_of((w[FLAGS_WORD] >> 21) & 3),
            timeout_ms: (w[FLAGS_WORD] >> 32) as u32,
        }
    }

    fn to_record(self, clock: Clock, extra: Option<&Extra>) -> Record {
        let name = |c| names::name(c).map(String::from);
        Record {
            id: self.id,
            kind: self.kind,
            seq: self.seq,
            op: names::name(self.op).unwrap_or("?").into(),
            dtype: name(self.dtype),
            count: (self.count != NO_COUNT).then_some(self.count),
            in_bytes: self.in_bytes,
            out_bytes: self.out_bytes,
            root: rank_of(self.root),
            peer: rank_of(self.peer),
            peers: extra.and_then(|e| e.peers.as_ref()).map(|p| p.to_vec()),
            reduce_op: name(self.reduce_op),
            async_op: self.async_op,
            algorithm: name(self.algorithm),
            transport: name(self.transport),
            timeout_ms: u64::from(self.timeout_ms),
            state: self.state,
            enqueued_ns: clock.to_ns(self.enqueued),
            started_ns: clock.to_ns(self.started),
            ended_ns: clock.to_ns(self.ended),
            error: extra.and_then(|e| e.error.as_deref()).map(Into::into),
            detail: extra.and_then(|e| e.detail.as_deref()).map(Into::into),
        }
    }
}

/// The parts of a record that do not fit in words: rare (batches, failures, splits).
#[derive(Debug, Clone, Default)]
struct Extra {
    peers: Option<Box<[PeerTransfer]>>,
    error: Option<Box<str>>,
    detail: Option<Box<str>>,
}

/// A slot of `N` words guarded by a sequence number (odd while being written).
#[derive(Debug)]
struct Slot<const N: usize> {
    seq: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> Default for Slot<N> {
    fn default() -> Self {
        Slot {
            seq: AtomicU64::new(0),
            words: [const { AtomicU64::new(0) }; N],
        }
    }
}

impl<const N: usize> Slot<N> {
    /// Writes `w`. Only one thread may write a slot at a time: the single writer of the
    /// execution side, or a thread that won [`Slot::claim`].
    #[inline]
    fn write_claimed(&self, seq: u64, w: [u64; N]) {
        // `seq` is odd (claimed); the data stores may not move before it.
        fence(Ordering::Release);
        for (a, x) in self.words.iter().zip(w) {
            a.store(x, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(1), Ordering::Release);
    }

    /// Writes `w` as the only writer of this slot.
    #[inline]
    fn write(&self, w: [u64; N]) {
        let s = self.seq.load(Ordering::Relaxed) | 1;
        self.seq.store(s, Ordering::Relaxed);
        self.write_claimed(s, w);
    }

    /// Changes words `i` and `j` to `a` and `b` as the only writer of this slot (the other
    /// words keep what this thread wrote last): two stores instead of `N`.
    #[inline]
    fn write_two(&self, (i, a): (usize, u64), (j, b): (usize, u64)) {
        let s = self.seq.load(Ordering::Relaxed) | 1;
        self.seq.store(s, Ordering::Relaxed);
        fence(Ordering::Release);
        self.words[i].store(a, Ordering::Relaxed);
        self.words[j].store(b, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Word `i` as last written by the calling thread (the slot's only writer).
    #[inline]
    fn own_word(&self, i: usize) -> u64 {
        self.words[i].load(Ordering::Relaxed)
    }

    /// Claims the slot for writing (several threads may try); returns the odd sequence to pass
    /// to [`Slot::write_claimed`], or `None` while another thread writes it.
    #[inline]
    fn claim(&self) -> Option<u64> {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 1 {
            return None;
        }
        self.seq
            .compare_exchange(s, s + 1, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| s + 1)
    }

    /// The words as last written by the calling thread (the slot's only writer).
    #[inline]
    fn own(&self) -> [u64; N] {
        std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed))
    }

    /// A consistent copy; `None` if writers kept it busy for 50 ms (a writer holds it for a
    /// few nanoseconds per operation; a preempted one for a time slice).
    fn read(&self) -> Option<[u64; N]> {
        let mut since: Option<std::time::Instant> = None;
        for i in 0u32.. {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let w = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    return Some(w);
                }
            }
            if i % 64 == 63 {
                let t0 = *since.get_or_insert_with(std::time::Instant::now);
                if t0.elapsed() > Duration::from_millis(50) {
                    return None;
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        None
    }
}

/// Source of [`CommTrace`]'s `uid` (0 is [`Waited::NONE`]'s).
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// `Queued::enqueued` of an operation whose enqueue time is its start time (see
/// [`CommTrace::submit`]).
const ENQUEUED_AT_START: u64 = 0;

/// Operations submitted but not yet started that a dump can show (at most the buffer size).
const QUEUED_SLOTS: usize = 1024;

/// A submitted operation as the submitting thread records it.
#[derive(Debug, Clone, Copy, Default)]
struct Queued {
    id: u64,
    seq: u64,
    enqueued: u64,
    timeout_ms: u32,
    op: u16,
    kind: RecordKind,
    async_op: Option<bool>,
}

impl Queued {
    fn pack(&self) -> [u64; 4] {
        [
            self.id,
            self.seq,
            self.enqueued,
            u64::from(self.op)
                | kind_code(self.kind) << 16
                | async_code(self.async_op) << 18
                | u64::from(self.timeout_ms) << 32,
        ]
    }

    fn unpack(w: [u64; 4]) -> Queued {
        Queued {
            id: w[0],
            seq: w[1],
            enqueued: w[2],
            op: w[3] as u16,
            kind: kind_of((w[3] >> 16) & 3),
            async_op: async_of((w[3] >> 18) & 3),
            timeout_ms: (w[3] >> 32) as u32,
        }
    }
}

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
    trace: Arc<CommTrace>,
    /// False when tracing is off or this is not the trace's first writer.
    on: bool,
    /// Records started (this thread's copy of `ExecSide::count`).
    count: u64,
    /// Slot of the next record (`count % capacity`, kept without dividing).
    next: usize,
    /// A time at most a few polls before now while the thread has only polled for work since:
    /// the last end or [`TraceWriter::mark`]; 0 otherwise.
    anchor: u64,
    /// This thread's copy of `CommTrace::parked`.
    parked: bool,
    /// This thread's copy of `ExecSide::unwritten`.
    unwritten: u64,
    /// Highest sequence numbers started and completed, collective then p2p.
    started: [u64; 2],
    completed: [u64; 2],
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
    q: Queued,
    started: u64,
    ended: u64,
}

/// `OpRecord::slot` of a record not started yet.
const NOT_STARTED: u64 = u64::MAX;

/// A submitted operation on its way through the progress thread (see [`CommTrace::submit`]).
/// Small (40 bytes) and free of references to the trace, so the task that carries it across
/// threads stays small.
#[derive(Debug)]
pub struct OpRecord {
    q: Queued,
    /// Its slot number in the execution ring, once started.
    slot: u64,
}

impl Default for OpRecord {
    fn default() -> Self {
        OpRecord::NONE
    }
}

impl OpRecord {
    /// A record of nothing (tracing off).
    pub const NONE: OpRecord = OpRecord {
        q: Queued {
            id: 0,
            seq: 0,
            enqueued: 0,
            timeout_ms: 0,
            op: names::NONE,
            kind: RecordKind::Collective,
            async_op: None,
        },
        slot: NOT_STARTED,
    };

    /// What [`CommTrace::publish`] needs, copied out before the record moves to the progress
    /// thread.
    pub fn queued(&self) -> QueuedOp {
        QueuedOp(self.q)
    }

    /// True once [`TraceWriter::start`] recorded it (or nothing is recorded).
    pub fn is_started(&self) -> bool {
        self.q.id == 0 || self.slot != NOT_STARTED
    }

    /// What the thread that waits for the operation notes once it saw it complete (see
    /// [`Waited`]).
    pub fn waited(&self, trace: &CommTrace) -> Waited {
        if self.q.id == 0 {
            Waited::NONE
        } else {
            Waited::new(trace.uid, self.q.id)
        }
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
        let mut g = lock(&t.misc);
        let Some(m) = g.iter_mut().rev().find(|m| m.rec.id == self.id) else {
            return;
        };
        if m.rec.state.is_final() {
            return;
        }
        m.rec.state = state;
        m.rec.ended = now;
        m.extra.error = error;
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
        let mut w = t.writer();
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
        w.start(&mut a, || info("all_reduce"), Some("shm"), None);
        w.start(&mut a, || info("all_reduce"), Some("shm"), Some("ring"));
        w.finish(&mut a, Outcome::Completed);
        w.start(&mut b, || info("send"), Some("socket"), None);
        w.finish(&mut b, Outcome::TimedOut(&"too slow"));
        w.finish(&mut b, Outcome::Completed);
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
            w.finish(&mut r, Outcome::Completed);
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
        let mut w = t.writer();
        let mut h = t.submit(false, 1, "x", None, Duration::ZERO);
        w.start(&mut h, OpInfo::default, None, None);
        w.finish(&mut h, Outcome::Completed);
        assert!(t.snapshot().records.is_empty());
    }

    #[test]
    fn pausing_stops_and_resuming_restarts_recording() {
        let t = CommTrace::new(meta(), 100);
        let mut w = t.writer();
        assert!(t.is_recording());
        let run = |t: &CommTrace, w: &mut TraceWriter, seqs: std::ops::RangeInclusive<u64>| {
            for seq in seqs {
                let mut r = t.submit(false, seq, "all_reduce", None, Duration::from_secs(1));
                t.publish(r.queued());
                w.start(&mut r, || info("all_reduce"), Some("shm"), None);
                w.finish(&mut r, Outcome::Completed);
            }
        };
        run(&t, &mut w, 1..=3);
        // Submitted while recording, finished after the pause: recorded whole.
        let mut late = t.submit(false, 4, "all_reduce", None, Duration::from_secs(1));
        t.set_recording(false);
        assert!(!t.is_recording());
        w.start(&mut late, || info("all_reduce"), Some("shm"), None);
        w.finish(&mut late, Outcome::Completed);
        run(&t, &mut w, 5..=9);
        let h = t.begin_comm_op("split", Duration::from_secs(1), None);
        h.finish(Outcome::Completed);
        assert_eq!(t.recorded(), 4);
        let d = t.snapshot();
        assert_eq!(d.records.len(), 4);
        assert!(d.records.iter().all(|r| r.state == State::Completed));
        assert_eq!(d.collective.completed, 4);
        t.set_recording(true);
        run(&t, &mut w, 10..=11);
        assert_eq!(t.recorded(), 6);
        let d = t.snapshot();
        let seqs: Vec<u64> = d.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 10, 11]);
        assert_eq!(d.dropped, 0, "paused operations are not dropped records");
        assert_eq!(d.collective.completed, 11);
        // A trace without a buffer cannot be resumed.
        let off = CommTrace::new(meta(), 0);
        off.set_recording(true);
        assert!(!off.is_recording());
        assert_eq!(off.submit(false, 1, "x", None, Duration::ZERO).q.id, 0);
    }

    /// Starts and at once finishes `rec`, an all_reduce.
    fn run(w: &mut TraceWriter, rec: &mut OpRecord) {
        w.start(rec, || info("all_reduce"), None, None);
        w.finish(rec, Outcome::Completed);
    }

    /// Every record of `r` (from [`times`]) was enqueued, started and ended in that order.
    fn assert_in_order(r: &[(u64, u64, u64)]) {
        for (enq, start, end) in r {
            assert!(enq <= start && start <= end, "{r:?}");
        }
    }

    /// Raw enqueue, start and end times of the records of `t`, by id.
    fn times(t: &CommTrace) -> Vec<(u64, u64, u64)> {
        let ex = &t.exec;
        (0..ex.count.load(Ordering::Acquire) as usize)
            .map(|i| Rec::unpack(ex.slots[i].read().unwrap()))
            .map(|r| (r.enqueued, r.started, r.ended))
            .collect()
    }

    #[test]
    fn a_queued_op_starts_where_the_previous_ended() {
        let t = CommTrace::new(meta(), 100);
        let mut w = t.writer();
        let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
        let (mut a, mut b, mut c) = (sub(1), sub(2), sub(3));
        run(&mut w, &mut a);
        w.start(&mut b, || info("all_reduce"), None, None);
        // The thread waits in between: c reads the clock.
        w.finish(&mut b, Outcome::Completed);
        w.idle();
        std::thread::sleep(Duration::from_millis(2));
        run(&mut w, &mut c);
        // Submitted after the previous end while the thread polled: starts at its enqueue.
        std::thread::sleep(Duration::from_millis(2));
        let (mut d, mut e) = (sub(4), sub(5));
        t.set_recording(false);
        let mut x = sub(6);
        t.set_recording(true);
        run(&mut w, &mut d);
        // An operation not recorded runs in between: e, queued before d ended, reads the clock.
        w.start(&mut x, || info("all_reduce"), None, None);
        std::thread::sleep(Duration::from_millis(2));
        w.finish(&mut x, Outcome::Completed);
        run(&mut w, &mut e);
        let r = times(&t);
        assert_eq!(r.len(), 5);
        assert_in_order(&r);
        assert_eq!(r[1].1, r[0].2, "b starts where a ended");
        assert!(r[2].1 > r[1].2, "c waited: {r:?}");
        assert!(r[3].1 > r[2].2 && r[3].1 == r[3].0, "d came later: {r:?}");
        assert!(
            r[4].0 <= r[3].2 && r[4].1 > r[3].2,
            "x ran in between: {r:?}"
        );
    }

    #[test]
    fn an_op_found_while_polling_starts_at_its_enqueue_or_the_last_mark() {
        let t = CommTrace::new(meta(), 100);
        let mut w = t.writer();
        let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
        let mut a = sub(1);
        run(&mut w, &mut a);
        std::thread::sleep(Duration::from_millis(1));
        // b waits in the queue while the thread polls past a mark: it starts at the mark.
        let mut b = sub(2);
        std::thread::sleep(Duration::from_millis(1));
        w.mark();
        run(&mut w, &mut b);
        // c arrives after the last mark: found within a poll, it starts at its enqueue.
        w.mark();
        std::thread::sleep(Duration::from_millis(1));
        let mut c = sub(3);
        run(&mut w, &mut c);
        let r = times(&t);
        assert!(
            r[1].1 > r[1].0 && r[1].1 > r[0].2,
            "b started at the mark: {r:?}"
        );
        assert_eq!(r[2].1, r[2].0, "c started at its enqueue: {r:?}");
        assert_in_order(&r);
    }

    #[test]
    fn after_a_completion_this_thread_saw_the_next_op_is_enqueued_at_its_start() {
        let t = CommTrace::new(meta(), 100);
        let mut w = t.writer();
        let sub = |s| t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
        let mut a = sub(1);
        assert_ne!(a.q.enqueued, ENQUEUED_AT_START, "nothing waited yet");
        let waited = a.waited(&t);
        run(&mut w, &mut a);
        waited.note();
        let mut b = sub(2);
        assert_eq!(b.q.enqueued, ENQUEUED_AT_START, "no clock read");
        // Not shown queued (picked up within a poll), but counted as submitted.
        t.publish(b.queued());
        let d = t.snapshot();
        assert!(d.records.iter().all(|r| r.seq != 2), "{:?}", d.records);
        assert_eq!(d.collective.enqueued, 2);
        run(&mut w, &mut b);
        let r = times(&t);
        assert_eq!(
            (r[1].0, r[1].1),
            (r[0].2, r[0].2),
            "enqueued and started at a's end"
        );
        // Only the direct successor of what this thread waited for skips the clock.
        b.waited(&t).note();
        let (c, d) = (sub(3), sub(4));
        assert_eq!(c.q.enqueued, ENQUEUED_AT_START);
        assert_ne!(d.q.enqueued, ENQUEUED_AT_START);
        // While the progress thread sleeps, submissions read the clock, and so does a start
        // after it woke.
        b.waited(&t).note();
        w.park(true);
        let mut e = sub(5);
        b.waited(&t).note();
        let mut f = sub(6);
        assert_ne!(e.q.enqueued, ENQUEUED_AT_START);
        w.park(false);
        f.waited(&t).note();
        let g = sub(7);
        assert_eq!(g.q.enqueued, ENQUEUED_AT_START, "awake again");
        let mut c = c;
        run(&mut w, &mut c);
        w.idle();
        std::thread::sleep(Duration::from_millis(1));
        run(&mut w, &mut e);
        run(&mut w, &mut f);
        let r = times(&t);
        assert_eq!(r.len(), 5);
        assert!(r[3].1 > r[3].0, "e read the clock after the idle: {r:?}");
        assert_in_order(&r);
    }

    /// A trace, its writer, and an all_reduce whose start was pinned (after an idle, so by a
    /// clock read) 2 ms ago and not recorded.
    fn pinned_2_ms_ago() -> (Arc<CommTrace>, TraceWriter, OpRecord) {
        let t = CommTrace::new(meta(), 10);
        let mut w = t.writer();
        let a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
        w.idle();
        w.pin_start(&a);
        std::thread::sleep(Duration::from_millis(2));
        (t, w, a)
    }

    #[test]
    fn a_start_recorded_later_keeps_the_pinned_time() {
        let (t, mut w, mut a) = pinned_2_ms_ago();
        assert!(!a.is_started());
        w.start(&mut a, || info("all_reduce"), None, None);
        assert!(a.is_started());
        w.finish(&mut a, Outcome::Completed);
        let (_, started, ended) = times(&t)[0];
        // 2 ms apart: at least 10^6 ticks of a TSC of 1 GHz or more, or of the ns clock.
        assert!(ended - started >= 1_000_000, "{started} {ended}");
    }

    #[test]
    fn a_pinned_start_is_written_whole_later_and_dumps_wait_for_it() {
        let (t, mut w, mut a) = pinned_2_ms_ago();
        let details = || OpInfo {
            dtype: Some("float32"),
            count: Some(2),
            ..info("all_reduce")
        };
        let mut started_when_told = None;
        let ended = w.end_pinned_after(&mut a, || {
            // Nothing of the execution side is written before the caller is told.
            started_when_told = Some(t.exec.count.load(Ordering::Relaxed));
        });
        assert_eq!(started_when_told, Some(0));
        let ended = ended.expect("a pinned start is written later");
        // A dump taken now (the caller saw the completion) waits for the record.
        let dumper = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || t.snapshot())
        };
        std::thread::sleep(Duration::from_millis(5));
        w.write_ended(ended, details, Some("shm"), Some("shm"));
        for d in [dumper.join().unwrap(), t.snapshot()] {
            let r = &d.records[0];
            assert_eq!(r.state, State::Completed);
            assert_eq!((r.dtype.as_deref(), r.count), (Some("float32"), Some(2)));
            assert_eq!(r.transport.as_deref(), Some("shm"));
            assert_eq!((d.collective.started, d.collective.completed), (1, 1));
            // Started at the pinned time, not when it was written.
            assert!(r.ended_ns - r.started_ns >= 1_000_000, "{r:?}");
        }

        // A record a long wait already started is finished at once.
        let mut b = t.submit(false, 2, "all_reduce", None, Duration::from_secs(1));
        w.pin_start(&b);
        w.start(&mut b, details, Some("shm"), Some("shm"));
        assert!(w.end_pinned_after(&mut b, || {}).is_none());
        let d = t.snapshot();
        assert_eq!(d.records.len(), 2);
        assert_eq!(d.records[1].state, State::Completed);
        assert_eq!(d.collective.completed, 2);
        assert_eq!(t.exec.unwritten.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_dump_taken_after_the_signal_waits_for_the_end() {
        let t = CommTrace::new(meta(), 10);
        let mut w = t.writer();
        let mut a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
        w.start(&mut a, || info("all_reduce"), None, None);
        let mut dumper = None;
        w.finish_after(&mut a, Outcome::Completed, || {
            // The caller saw the completion and dumps at once, before the end is written.
            let t = Arc::clone(&t);
            dumper = Some(std::thread::spawn(move || t.snapshot()));
            std::thread::sleep(Duration::from_millis(5));
        });
        let d = dumper.unwrap().join().unwrap();
        assert_eq!(d.records[0].state, State::Completed);
        assert_eq!(d.collective.completed, 1);
        assert_eq!(t.exec.unwritten.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn records_pack_and_unpack() {
        let q = Queued {
            id: 7,
            seq: 3,
            enqueued: 99,
            timeout_ms: u32::MAX,
            op: names::code("reduce_scatter"),
            kind: RecordKind::P2p,
            async_op: Some(true),
        };
        let back = Queued::unpack(q.pack());
        assert_eq!((back.id, back.seq, back.enqueued), (7, 3, 99));
        assert_eq!(
            (back.timeout_ms, back.op, back.kind),
            (u32::MAX, q.op, RecordKind::P2p)
        );
        assert_eq!(back.async_op, Some(true));
        let mut r = Rec::queued(&q);
        r.count = 12345678901;
        r.root = 5;
        r.peer = NO_RANK;
        r.dtype = names::code("bf16");
        r.reduce_op = names::code("max");
        r.algorithm = names::code("ring");
        r.transport = names::code("shm+socket");
        r.kind = RecordKind::Comm;
        for state in [
            State::Queued,
            State::Started,
            State::Completed,
            State::Failed,
            State::TimedOut,
        ] {
            r.state = state;
            for a in [None, Some(false), Some(true)] {
                r.async_op = a;
                assert_eq!(Rec::unpack(r.pack()), r);
            }
        }
        let rec = r.to_record(Clock::System, None);
        assert_eq!(
            (rec.op.as_str(), rec.dtype.as_deref()),
            ("reduce_scatter", Some("bf16"))
        );
        assert_eq!(
            (rec.root, rec.peer, rec.count),
            (Some(5), None, Some(12345678901))
        );
    }

    #[test]
    fn only_the_first_writer_records() {
        let t = CommTrace::new(meta(), 4);
        let mut w = t.writer();
        let mut w2 = t.writer();
        let mut a = t.submit(false, 1, "all_reduce", None, Duration::from_secs(1));
        w2.start(&mut a, || info("all_reduce"), None, None);
        assert!(t.snapshot().records.is_empty());
        w.start(&mut a, || info("all_reduce"), None, None);
        assert_eq!(t.snapshot().records[0].state, State::Started);
    }

    #[test]
    fn a_slot_is_read_whole_or_not_at_all() {
        let slot = Arc::new(Slot::<WORDS>::default());
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (slot, stop) = (Arc::clone(&slot), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    k += 1;
                    slot.write([k; WORDS]);
                    // An operation's worth of other work between two records.
                    for _ in 0..4 {
                        std::hint::spin_loop();
                    }
                }
                k
            })
        };
        let (mut reads, mut moved) = (0u64, 0u64);
        let mut last = 0;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_millis(500) {
            let w = slot
                .read()
                .expect("the writer never holds the slot for long");
            assert!(w.iter().all(|x| *x == w[0]), "torn read: {w:?}");
            moved += u64::from(w[0] != last);
            last = w[0];
            reads += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let written = writer.join().unwrap();
        assert!(
            reads > 1000 && written > 1000 && moved > 10,
            "{reads} {written} {moved}"
        );
    }

    #[test]
    fn dumps_see_whole_records_while_the_writer_runs() {
        // A dump taken while the progress thread writes never shows a record mixed from two
        // operations (ids and sequence numbers move together; counts match them).
        let t = CommTrace::new(meta(), 8);
        let mut w = t.writer();
        let writer = {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for s in 1..=20_000u64 {
                    let mut r = t.submit(false, s, "all_reduce", None, Duration::from_secs(1));
                    let inf = || OpInfo {
                        op: "all_reduce",
                        count: Some(s * 3),
                        in_bytes: s * 12,
                        ..OpInfo::default()
                    };
                    w.start(&mut r, inf, Some("shm"), None);
                    w.finish(&mut r, Outcome::Completed);
                }
            })
        };
        let mut checked = 0;
        while !writer.is_finished() || checked == 0 {
            for r in t.snapshot().records {
                assert_eq!(r.count, Some(r.seq * 3), "{r:?}");
                assert_eq!(r.in_bytes, r.seq * 12, "{r:?}");
                assert_eq!(r.id, r.seq, "{r:?}");
                // The end time and the state are written together (two words of the slot).
                assert_eq!(
                    r.state == State::Completed,
                    r.ended_ns >= r.started_ns && r.ended_ns > 0,
                    "{r:?}"
                );
                checked += 1;
            }
        }
        writer.join().unwrap();
        let d = t.snapshot();
        assert_eq!(d.collective.completed, 20_000);
        assert_eq!(d.records.len(), 8);
        assert!(checked > 0);
    }

    #[test]
    fn batch_peers_and_errors_survive_until_their_record_leaves() {
        let t = CommTrace::new(meta(), 2);
        let mut w = t.writer();
        let mut b = t.submit(true, 1, "batch", None, Duration::from_secs(1));
        let inf = || OpInfo {
            op: "batch",
            peers: vec![PeerTransfer {
                send: true,
                peer: 0,
                bytes: 8,
            }],
            ..OpInfo::default()
        };
        w.start(&mut b, inf, Some("socket"), None);
        w.finish(&mut b, Outcome::Failed(&"peer 0 lost"));
        let d = t.snapshot();
        assert_eq!(d.records[0].peers.as_ref().unwrap().len(), 1);
        assert_eq!(d.records[0].error.as_deref(), Some("peer 0 lost"));
        for s in 2..10 {
            let mut r = t.submit(true, s, "send", None, Duration::from_secs(1));
            w.finish(&mut r, Outcome::Failed(&"x"));
        }
        assert!(
            lock(&t.exec.extra).len() <= 4,
            "extras are evicted with their records"
        );
    }
}
