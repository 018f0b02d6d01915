//! What the engine holds for an operation: its record on the way, its outcome, and handles.

use std::sync::Arc;

use super::{lock, CommTrace, Queued};
use crate::names;
use crate::schema::{RecordKind, State};
use crate::waited::Waited;

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
    pub(super) fn parts(self) -> (State, Option<Box<str>>) {
        match self {
            Outcome::Completed => (State::Completed, None),
            Outcome::Failed(e) => (State::Failed, Some(e.to_string().into_boxed_str())),
            Outcome::TimedOut(e) => (State::TimedOut, Some(e.to_string().into_boxed_str())),
        }
    }
}

/// `OpRecord::slot` of a record not started yet.
pub(super) const NOT_STARTED: u64 = u64::MAX;

/// A submitted operation on its way through the progress thread (see [`CommTrace::submit`]).
/// Small (40 bytes) and free of references to the trace, so the task that carries it across
/// threads stays small.
#[derive(Debug)]
pub struct OpRecord {
    pub(super) q: Queued,
    /// Its slot number in the execution ring, once started.
    pub(super) slot: u64,
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
pub struct QueuedOp(pub(super) Queued);

/// A handle to a communicator-level step (`init`, `split`), which the calling thread ends.
#[derive(Debug, Default)]
pub struct OpHandle {
    pub(super) trace: Option<Arc<CommTrace>>,
    pub(super) id: u64,
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
