//! The packed record: eleven words per started operation, four per queued stub, names as codes.

use super::ENQUEUED_AT_START;
use crate::clock::Clock;
use crate::names;
use crate::schema::{PeerTransfer, Record, RecordKind, State};

/// "No count" in a packed record.
pub(super) const NO_COUNT: u64 = u64::MAX;
/// "No rank" in a packed record.
pub(super) const NO_RANK: u32 = u32::MAX;

pub(super) fn kind_code(k: RecordKind) -> u64 {
    match k {
        RecordKind::Collective => 0,
        RecordKind::P2p => 1,
        RecordKind::Comm => 2,
    }
}

pub(super) fn kind_of(c: u64) -> RecordKind {
    match c {
        1 => RecordKind::P2p,
        2 => RecordKind::Comm,
        _ => RecordKind::Collective,
    }
}

pub(super) fn state_code(s: State) -> u64 {
    match s {
        State::Queued => 0,
        State::Started => 1,
        State::Completed => 2,
        State::Failed => 3,
        State::TimedOut => 4,
    }
}

pub(super) fn state_of(c: u64) -> State {
    match c {
        1 => State::Started,
        2 => State::Completed,
        3 => State::Failed,
        4 => State::TimedOut,
        _ => State::Queued,
    }
}

pub(super) fn async_code(a: Option<bool>) -> u64 {
    match a {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    }
}

pub(super) fn async_of(c: u64) -> Option<bool> {
    match c {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}

pub(super) fn rank_code(r: Option<usize>) -> u32 {
    r.and_then(|r| u32::try_from(r).ok()).unwrap_or(NO_RANK)
}

pub(super) fn rank_of(r: u32) -> Option<usize> {
    (r != NO_RANK).then_some(r as usize)
}

/// Words of a packed record.
pub(super) const WORDS: usize = 11;
/// Word of a packed record holding the end time.
pub(super) const ENDED_WORD: usize = 4;
/// Word of a packed record holding the transport, kind, state, async flag and timeout.
pub(super) const FLAGS_WORD: usize = 10;
/// Position of the state (3 bits) in [`FLAGS_WORD`].
pub(super) const STATE_SHIFT: u32 = 18;

/// One operation, fixed size, names as codes; timestamps in the trace's clock unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rec {
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) enqueued: u64,
    pub(super) started: u64,
    pub(super) ended: u64,
    pub(super) count: u64,
    pub(super) in_bytes: u64,
    pub(super) out_bytes: u64,
    pub(super) root: u32,
    pub(super) peer: u32,
    pub(super) timeout_ms: u32,
    pub(super) op: u16,
    pub(super) dtype: u16,
    pub(super) reduce_op: u16,
    pub(super) algorithm: u16,
    pub(super) transport: u16,
    pub(super) kind: RecordKind,
    pub(super) state: State,
    pub(super) async_op: Option<bool>,
}

impl Rec {
    /// What the submitting thread knows.
    pub(super) fn queued(q: &Queued) -> Rec {
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
    pub(super) fn queued_until(q: &Queued, now: u64) -> Rec {
        let mut r = Rec::queued(q);
        if r.enqueued == ENQUEUED_AT_START {
            r.enqueued = now;
        }
        r
    }

    pub(super) fn pack(&self) -> [u64; WORDS] {
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

    pub(super) fn unpack(w: [u64; WORDS]) -> Rec {
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

    pub(super) fn to_record(self, clock: Clock, extra: Option<&Extra>) -> Record {
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
pub(super) struct Extra {
    pub(super) peers: Option<Box<[PeerTransfer]>>,
    pub(super) error: Option<Box<str>>,
    pub(super) detail: Option<Box<str>>,
}

/// A submitted operation as the submitting thread records it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Queued {
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) enqueued: u64,
    pub(super) timeout_ms: u32,
    pub(super) op: u16,
    pub(super) kind: RecordKind,
    pub(super) async_op: Option<bool>,
}

impl Queued {
    pub(super) fn pack(&self) -> [u64; 4] {
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

    pub(super) fn unpack(w: [u64; 4]) -> Queued {
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
