//! The completion side of an operation: the caller holds a [`Request`], the progress thread
//! finishes it.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

#[derive(Debug, Clone)]
enum State {
    Queued,
    Started,
    Done,
    Failed(Error),
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// Lifecycle of an operation as seen by its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    /// Waiting in the communicator's queue.
    Queued,
    /// Running on the progress thread.
    Started,
    /// Finished successfully.
    Completed,
    /// Finished with an error.
    Failed,
}

/// Handle to a submitted operation. Cloning shares the same operation.
#[derive(Debug, Clone)]
#[must_use = "a request should be waited on to learn whether the operation succeeded"]
pub struct Request {
    shared: Arc<Shared>,
    op: &'static str,
    seq: u64,
}

impl Request {
    pub(crate) fn new(op: &'static str, seq: u64) -> Request {
        Request {
            shared: Arc::new(Shared {
                state: Mutex::new(State::Queued),
                cv: Condvar::new(),
            }),
            op,
            seq,
        }
    }

    /// A request that already failed (used when submission itself is refused).
    pub(crate) fn failed(op: &'static str, seq: u64, err: Error) -> Request {
        let r = Request::new(op, seq);
        r.finish(Err(err));
        r
    }

    /// Name of the operation.
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Sequence number of the operation on its communicator.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn start(&self) {
        let mut s = self.lock();
        if matches!(*s, State::Queued) {
            *s = State::Started;
        }
    }

    pub(crate) fn finish(&self, result: Result<()>) {
        let mut s = self.lock();
        *s = match result {
            Ok(()) => State::Done,
            Err(e) => State::Failed(e),
        };
        self.shared.cv.notify_all();
    }

    /// Current status, without waiting.
    pub fn status(&self) -> RequestStatus {
        match &*self.lock() {
            State::Queued => RequestStatus::Queued,
            State::Started => RequestStatus::Started,
            State::Done => RequestStatus::Completed,
            State::Failed(_) => RequestStatus::Failed,
        }
    }

    /// True once the operation finished, successfully or not.
    pub fn is_completed(&self) -> bool {
        matches!(
            self.status(),
            RequestStatus::Completed | RequestStatus::Failed
        )
    }

    /// The error of a failed operation.
    pub fn error(&self) -> Option<Error> {
        match &*self.lock() {
            State::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// Blocks until the operation finishes or `timeout` passes; a passed timeout is an
    /// [`Error::Timeout`] but does not cancel the operation.
    pub fn wait_timeout(&self, timeout: Duration, rank: usize) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = self.lock();
        loop {
            match &*s {
                State::Done => return Ok(()),
                State::Failed(e) => return Err(e.clone()),
                State::Queued | State::Started => {}
            }
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::Timeout {
                    op: self.op.to_string(),
                    seq: self.seq,
                    rank,
                    peer: None,
                    timeout,
                });
            }
            s = self
                .shared
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
