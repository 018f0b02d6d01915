//! The completion side of an operation: the caller holds a [`Request`], the progress thread
//! finishes it. A waiting caller spins briefly on an atomic flag before it sleeps on a condition
//! variable, and the progress thread only makes the wake-up system call when somebody sleeps:
//! for short operations both thread hand-offs stay in user space. Callers that cannot block
//! (the Python bindings completing a `torch.futures.Future`) register a callback instead
//! ([`Request::on_finish`]), which the finishing thread runs.

use std::sync::atomic::{AtomicBool, Ordering};
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
    locked: Mutex<Locked>,
    cv: Condvar,
    /// Set (release) once the state is final: what a spinning waiter watches.
    finished: AtomicBool,
    /// Set when the operation will take long and its engine wants every core: a waiter stops
    /// spinning and sleeps (see [`Request::expect_long`]).
    long: AtomicBool,
}

/// What `Shared::locked` guards.
#[derive(Debug)]
struct Locked {
    state: State,
    /// Waiters asleep on `cv`: a finish without any makes no wake-up call.
    sleepers: usize,
    /// Run once by the thread that finishes the request.
    on_finish: FinishCallbacks,
}

/// A function [`Request::on_finish`] runs once the request finished.
pub type FinishCallback = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct FinishCallbacks(Vec<FinishCallback>);

impl std::fmt::Debug for FinishCallbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} finish callback(s)", self.0.len())
    }
}

/// Runs finish callbacks; one that panics is logged, never unwinds into the engine's thread.
fn run_callbacks(callbacks: Vec<FinishCallback>, op: &str, seq: u64) {
    for cb in callbacks {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(cb)).is_err() {
            tracing::error!(op, seq, "a finish callback panicked");
        }
    }
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
    /// How long a waiter spins on `finished` before it sleeps.
    spin: Duration,
    /// Noted by a thread that saw the operation complete (see [`colltrace::Waited`]).
    waited: colltrace::Waited,
}

impl Request {
    pub(crate) fn new(op: &'static str, seq: u64, spin: Duration) -> Request {
        Request {
            shared: Arc::new(Shared {
                locked: Mutex::new(Locked {
                    state: State::Queued,
                    sleepers: 0,
                    on_finish: FinishCallbacks::default(),
                }),
                cv: Condvar::new(),
                finished: AtomicBool::new(false),
                long: AtomicBool::new(false),
            }),
            op,
            seq,
            spin,
            waited: colltrace::Waited::NONE,
        }
    }

    /// The request, noting `waited` once a wait sees it complete.
    pub(crate) fn noting(mut self, waited: colltrace::Waited) -> Request {
        self.waited = waited;
        self
    }

    /// A request that already failed (used when submission itself is refused).
    pub(crate) fn failed(op: &'static str, seq: u64, err: Error) -> Request {
        let r = Request::new(op, seq, Duration::ZERO);
        r.finish(Err(err));
        r
    }

    /// A request that already completed (an operation with nothing to do).
    pub(crate) fn completed(op: &'static str, seq: u64) -> Request {
        let r = Request::new(op, seq, Duration::ZERO);
        r.finish(Ok(()));
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Locked> {
        self.shared.locked.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn start(&self) {
        let mut s = self.lock();
        if matches!(s.state, State::Queued) {
            s.state = State::Started;
        }
    }

    /// Tells a spinning waiter to sleep instead: the operation runs on helper threads that
    /// need the cores (a shared-memory collective cut into lanes), and lasts far longer than a
    /// wake-up takes. With 8 ranks on 16 cores, callers spinning through the first 30 us of
    /// every such operation left a third of the threads without a core.
    pub(crate) fn expect_long(&self) {
        self.shared.long.store(true, Ordering::Release);
    }

    pub(crate) fn finish(&self, result: Result<()>) {
        let callbacks = {
            let mut s = self.lock();
            s.state = match result {
                Ok(()) => State::Done,
                Err(e) => State::Failed(e),
            };
            self.shared.finished.store(true, Ordering::Release);
            if s.sleepers > 0 {
                self.shared.cv.notify_all();
            }
            std::mem::take(&mut s.on_finish.0)
        };
        run_callbacks(callbacks, self.op, self.seq);
    }

    /// Runs `f` once the operation finished, successfully or not: on the thread that finishes
    /// it (the communicator's progress thread), or at once on this thread if it already has.
    /// `f` must be quick and must not block (hand the news to another thread); a panic in it
    /// is logged and goes no further.
    pub fn on_finish(&self, f: FinishCallback) {
        let mut s = self.lock();
        if matches!(s.state, State::Done | State::Failed(_)) {
            drop(s);
            run_callbacks(vec![f], self.op, self.seq);
        } else {
            s.on_finish.0.push(f);
        }
    }

    /// Current status, without waiting.
    pub fn status(&self) -> RequestStatus {
        match &self.lock().state {
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
        match &self.lock().state {
            State::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    /// Blocks until the operation finishes or `timeout` passes; a passed timeout is an
    /// [`Error::Timeout`] but does not cancel the operation.
    pub fn wait_timeout(&self, timeout: Duration, rank: usize) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        super::spin::spin_for(self.spin, || {
            let sh = &self.shared;
            (sh.finished.load(Ordering::Acquire) || sh.long.load(Ordering::Acquire)).then_some(())
        });
        let mut s = self.lock();
        loop {
            match &s.state {
                State::Done => {
                    self.waited.note();
                    return Ok(());
                }
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
            s.sleepers += 1;
            s = self
                .shared
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            s.sleepers -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish_later(
        r: &Request,
        after: Duration,
        result: Result<()>,
    ) -> std::thread::JoinHandle<()> {
        let r = r.clone();
        std::thread::spawn(move || {
            std::thread::sleep(after);
            r.finish(result);
        })
    }

    #[test]
    fn a_spinning_waiter_sees_a_finish_within_its_window() {
        let r = Request::new("all_reduce", 1, Duration::from_secs(5));
        let t = finish_later(&r, Duration::from_millis(20), Ok(()));
        r.wait_timeout(Duration::from_secs(10), 0).unwrap();
        t.join().unwrap();
        assert_eq!(r.status(), RequestStatus::Completed);
    }

    #[test]
    fn a_waiter_told_the_operation_is_long_sleeps_and_is_woken() {
        let r = Request::new("all_reduce", 4, Duration::from_secs(3600));
        r.expect_long();
        let finisher = r.clone();
        // Finishes once the waiter sleeps (or after 10 s, to fail rather than hang).
        let t = std::thread::spawn(move || {
            let t0 = Instant::now();
            while finisher.lock().sleepers == 0 && t0.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let slept = finisher.lock().sleepers == 1;
            finisher.finish(Ok(()));
            slept
        });
        r.wait_timeout(Duration::from_secs(30), 0).unwrap();
        assert!(
            t.join().unwrap(),
            "the waiter spun through a long operation"
        );
        assert_eq!(r.status(), RequestStatus::Completed);
    }

    #[test]
    fn a_waiter_past_its_spin_sleeps_and_is_woken() {
        for spin in [Duration::ZERO, Duration::from_micros(1)] {
            let r = Request::new("barrier", 2, spin);
            let t = finish_later(&r, Duration::from_millis(100), Ok(()));
            let t0 = Instant::now();
            r.wait_timeout(Duration::from_secs(30), 0).unwrap();
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "woken late: {:?}",
                t0.elapsed()
            );
            t.join().unwrap();
            // The sleeper counted itself out again: later finishes skip the wake-up call.
            assert_eq!(r.lock().sleepers, 0);
        }
    }

    #[test]
    fn a_failure_reaches_spinning_and_sleeping_waiters() {
        for spin in [Duration::from_secs(5), Duration::ZERO] {
            let r = Request::new("all_gather", 3, spin);
            let err = Error::NotSupported("on purpose".into());
            let t = finish_later(&r, Duration::from_millis(30), Err(err));
            let got = r.wait_timeout(Duration::from_secs(30), 0).unwrap_err();
            assert!(got.to_string().contains("on purpose"), "{got}");
            t.join().unwrap();
        }
    }

    #[test]
    fn finish_callbacks_run_once_on_the_finishing_thread_or_at_once() {
        use std::sync::atomic::AtomicUsize;
        let r = Request::new("all_reduce", 5, Duration::ZERO);
        let ran = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let ran = Arc::clone(&ran);
            r.on_finish(Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                tx.send(std::thread::current().id()).unwrap();
            }));
        }
        // A panicking callback does not stop the others nor the finishing thread.
        r.on_finish(Box::new(|| panic!("on purpose")));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        let t = finish_later(&r, Duration::from_millis(10), Ok(()));
        let finisher = t.thread().id();
        t.join().unwrap();
        assert_eq!(rx.recv().unwrap(), finisher);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        // Registered after the finish: runs at once, here.
        let here = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&here);
        r.on_finish(Box::new(move || {
            h.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(here.load(Ordering::SeqCst), 1);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_request_never_finished_times_out_after_spinning() {
        let r = Request::new("broadcast", 4, Duration::from_millis(10));
        let t0 = Instant::now();
        let err = r.wait_timeout(Duration::from_millis(50), 3).unwrap_err();
        assert!(t0.elapsed() >= Duration::from_millis(50));
        assert!(
            matches!(
                err,
                Error::Timeout {
                    seq: 4,
                    rank: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(r.status(), RequestStatus::Queued);
    }
}
