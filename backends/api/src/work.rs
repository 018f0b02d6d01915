//! Work handles: what an operation returns, to wait on or poll.

use std::fmt::Debug;
use std::time::Duration;

use crate::error::Result;

/// Where an operation stands (torchcomms' `WorkStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkStatus {
    /// Queued, not started.
    NotStarted,
    /// Running.
    InProgress,
    /// Finished successfully.
    Completed,
    /// Did not finish in time.
    TimedOut,
    /// Failed.
    Error,
}

/// A function [`Work::on_complete`] runs once the work finished.
pub type OnComplete = Box<dyn FnOnce() + Send>;

/// What a backend implements for its work objects.
pub trait WorkHandle: Send + Sync + Debug {
    /// Waits for the work: CPU backends block until it finishes or `timeout` passes; CUDA
    /// backends make the caller's stream wait for it and return without blocking the host.
    fn wait(&self, timeout: Duration) -> Result<()>;
    /// Blocks the host until the work finishes or `timeout` passes (the same as `wait` unless
    /// the backend is stream-ordered).
    fn wait_blocking(&self, timeout: Duration) -> Result<()> {
        self.wait(timeout)
    }
    /// Makes the raw CUDA stream `stream` wait for the work without blocking the host (what
    /// `wait` does for the stream the work was issued from). Backends that are not
    /// stream-ordered wait as `wait` does.
    fn wait_on_stream(&self, stream: u64, timeout: Duration) -> Result<()> {
        let _ = stream;
        self.wait(timeout)
    }
    /// Current status.
    fn status(&self) -> WorkStatus;
    /// The error of failed work.
    fn error(&self) -> Option<crate::Error>;
    /// Arranges for `f` to run once the work finished (successfully or not): on the thread
    /// that finishes it, or at once if it already has. A handle that cannot tell (the default)
    /// hands `f` back, and the caller watches [`WorkHandle::status`] instead.
    fn on_complete(&self, f: OnComplete) -> std::result::Result<(), OnComplete> {
        Err(f)
    }
}

/// A work handle that is complete from the start (synchronous ops, empty batches).
#[derive(Debug)]
struct Completed;

impl WorkHandle for Completed {
    fn wait(&self, _timeout: Duration) -> Result<()> {
        Ok(())
    }
    fn status(&self) -> WorkStatus {
        WorkStatus::Completed
    }
    fn error(&self) -> Option<crate::Error> {
        None
    }
    fn on_complete(&self, f: OnComplete) -> std::result::Result<(), OnComplete> {
        f();
        Ok(())
    }
}

/// The result of an operation (torchcomms' `TorchWork`). Dropping it without waiting is fine:
/// the operation still runs to completion and keeps its tensors alive until then.
#[derive(Debug)]
#[must_use = "wait() on the work to learn whether the operation succeeded"]
pub struct Work {
    handle: Box<dyn WorkHandle>,
    timeout: Duration,
}

impl Work {
    /// Wraps a backend handle; `timeout` is the operation's timeout, used by [`Work::wait`].
    pub fn new(handle: Box<dyn WorkHandle>, timeout: Duration) -> Work {
        Work { handle, timeout }
    }

    /// A work that is already complete.
    pub fn completed() -> Work {
        Work {
            handle: Box::new(Completed),
            timeout: Duration::ZERO,
        }
    }

    /// Waits for the work. On CPU backends this blocks until it finishes (the operation's own
    /// deadline bounds the wait); on CUDA backends it makes the caller's stream wait for the
    /// work and returns at once (ProcessGroupNCCL's semantics).
    pub fn wait(&self) -> Result<()> {
        // The engine fails the op at its deadline; the margin covers the hand-over.
        self.handle.wait(self.timeout + Duration::from_secs(2))
    }

    /// Makes the raw CUDA stream `stream` wait for the work (torch's current stream at the time
    /// of the wait, as upstream's `TorchWork::wait`); on CPU backends the same as [`Work::wait`].
    pub fn wait_on_stream(&self, stream: u64) -> Result<()> {
        self.handle
            .wait_on_stream(stream, self.timeout + Duration::from_secs(2))
    }

    /// Blocks the host until the work finishes, also on stream-ordered (CUDA) backends whose
    /// [`Work::wait`] only orders the caller's stream after the work.
    pub fn wait_blocking(&self) -> Result<()> {
        self.handle
            .wait_blocking(self.timeout + Duration::from_secs(2))
    }

    /// Blocks until the work finishes or `timeout` passes (the work keeps running).
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        self.handle.wait(timeout)
    }

    /// True once the work finished, successfully or not.
    pub fn is_completed(&self) -> bool {
        matches!(
            self.handle.status(),
            WorkStatus::Completed | WorkStatus::Error | WorkStatus::TimedOut
        )
    }

    /// Current status.
    pub fn status(&self) -> WorkStatus {
        self.handle.status()
    }

    /// The error of failed work.
    pub fn error(&self) -> Option<crate::Error> {
        self.handle.error()
    }

    /// Runs `f` once the work finished, successfully or not, on the thread that finishes it
    /// (a backend's progress thread: `f` must be quick and must not block), or at once if it
    /// already has. Hands `f` back when the backend cannot notify; poll
    /// [`Work::is_completed`] then.
    pub fn on_complete(&self, f: OnComplete) -> std::result::Result<(), OnComplete> {
        self.handle.on_complete(f)
    }
}

/// Work made of several: finished when all are, failed when one failed (a composed operation
/// such as a persistent all-gather's puts and signals).
#[derive(Debug)]
struct AllOf(Vec<Work>);

impl WorkHandle for AllOf {
    fn wait(&self, timeout: Duration) -> Result<()> {
        self.0.iter().try_for_each(|w| w.handle.wait(timeout))
    }
    fn wait_blocking(&self, timeout: Duration) -> Result<()> {
        self.0
            .iter()
            .try_for_each(|w| w.handle.wait_blocking(timeout))
    }
    fn wait_on_stream(&self, stream: u64, timeout: Duration) -> Result<()> {
        self.0
            .iter()
            .try_for_each(|w| w.handle.wait_on_stream(stream, timeout))
    }
    fn status(&self) -> WorkStatus {
        let statuses: Vec<WorkStatus> = self.0.iter().map(Work::status).collect();
        [
            WorkStatus::Error,
            WorkStatus::TimedOut,
            WorkStatus::InProgress,
            WorkStatus::NotStarted,
        ]
        .into_iter()
        .find(|s| statuses.contains(s))
        .unwrap_or(WorkStatus::Completed)
    }
    fn error(&self) -> Option<crate::Error> {
        self.0.iter().find_map(Work::error)
    }
}

impl Work {
    /// One work for all of `works` (each keeps its own timeout; `timeout` is the longest a
    /// wait on the whole may take per part).
    pub fn all(works: Vec<Work>, timeout: Duration) -> Work {
        Work::new(Box::new(AllOf(works)), timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[derive(Debug)]
    struct Silent;

    impl WorkHandle for Silent {
        fn wait(&self, _timeout: Duration) -> Result<()> {
            Ok(())
        }
        fn status(&self) -> WorkStatus {
            WorkStatus::InProgress
        }
        fn error(&self) -> Option<crate::Error> {
            None
        }
    }

    #[test]
    fn a_completed_work_runs_the_callback_at_once() {
        let ran = Arc::new(AtomicBool::new(false));
        let r = Arc::clone(&ran);
        let back = Work::completed().on_complete(Box::new(move || r.store(true, Ordering::SeqCst)));
        assert!(back.is_ok());
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn a_handle_that_cannot_notify_hands_the_callback_back() {
        let w = Work::new(Box::new(Silent), Duration::from_secs(1));
        let ran = Arc::new(AtomicBool::new(false));
        let r = Arc::clone(&ran);
        let back = w.on_complete(Box::new(move || r.store(true, Ordering::SeqCst)));
        let f = back.expect_err("Silent cannot notify");
        assert!(!ran.load(Ordering::SeqCst));
        f();
        assert!(ran.load(Ordering::SeqCst));
    }
}
