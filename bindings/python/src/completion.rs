//! Completion callbacks: `TorchWork._add_done_callback(fn)` runs `fn(error)` once the operation
//! finished (`error` is `None`, or the exception `wait()` would raise). The `torch.distributed`
//! backend (`torchcomms/_c10d.py`) completes the `torch.futures.Future` of a work this way, so
//! DDP communication hooks and `Work.get_future()` work without a Python thread per operation.
//!
//! The engine tells us: a work's completion callback ([`torchcomms::Work::on_complete`], run on
//! the communicator's progress thread) only queues the news; one process-wide thread
//! (`torchcomms-completer`) takes the queue, attaches to the interpreter and calls the Python
//! callbacks in completion order. Works whose backend cannot notify (device works, whose
//! completion the `torch.distributed` layer orders with CUDA events instead) are polled by the
//! same thread every [`POLL`] while any is pending.

use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use torchcomms::{OnComplete, Work};

use crate::core::CommCore;
use crate::error::ResultExt;

/// How often works that cannot notify are looked at.
const POLL: Duration = Duration::from_millis(1);

/// A callback waiting to run, with what it reports on.
#[derive(Debug)]
struct Ready {
    work: Arc<Work>,
    comm: Arc<CommCore>,
    callback: Py<PyAny>,
}

struct Polled {
    work: Arc<Work>,
    notify: OnComplete,
}

#[derive(Default)]
struct Queue {
    ready: Vec<Ready>,
    polled: Vec<Polled>,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Queue({} ready, {} polled)",
            self.ready.len(),
            self.polled.len()
        )
    }
}

#[derive(Debug, Default)]
struct Completer {
    queue: Mutex<Queue>,
    more: Condvar,
}

fn completer() -> &'static Completer {
    static C: OnceLock<Completer> = OnceLock::new();
    static STARTED: OnceLock<bool> = OnceLock::new();
    let c = C.get_or_init(Completer::default);
    STARTED.get_or_init(|| {
        match std::thread::Builder::new()
            .name("torchcomms-completer".into())
            .spawn(|| run(C.get().expect("initialised above")))
        {
            Ok(_) => true,
            Err(e) => {
                tracing::error!("torchcomms: cannot start the completion thread: {e}");
                false
            }
        }
    });
    c
}

impl Completer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push_ready(&self, r: Ready) {
        self.lock().ready.push(r);
        self.more.notify_one();
    }
}

/// Runs `callback(error)` once `work` (an operation of `comm`) finished; see the module
/// documentation. Called with the GIL held.
pub(crate) fn add_done_callback(work: &Arc<Work>, comm: &Arc<CommCore>, callback: Py<PyAny>) {
    let c = completer();
    let ready = Ready {
        work: Arc::clone(work),
        comm: Arc::clone(comm),
        callback,
    };
    let notify: OnComplete = Box::new(move || c.push_ready(ready));
    if let Err(notify) = work.on_complete(notify) {
        c.lock().polled.push(Polled {
            work: Arc::clone(work),
            notify,
        });
        c.more.notify_one();
    }
}

fn run(c: &'static Completer) {
    loop {
        let ready = {
            let mut q = c.lock();
            loop {
                // Works that cannot notify: move the finished ones to `ready`.
                let mut i = 0;
                while i < q.polled.len() {
                    if q.polled[i].work.is_completed() {
                        let p = q.polled.swap_remove(i);
                        // `notify` pushes onto `ready`, which needs the lock we hold.
                        drop(q);
                        (p.notify)();
                        q = c.lock();
                    } else {
                        i += 1;
                    }
                }
                if !q.ready.is_empty() {
                    break std::mem::take(&mut q.ready);
                }
                q = if q.polled.is_empty() {
                    c.more.wait(q).unwrap_or_else(|p| p.into_inner())
                } else {
                    c.more
                        .wait_timeout(q, POLL)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                };
            }
        };
        // None when the interpreter is gone: nothing is left to tell.
        let _ = Python::try_attach(|py| {
            for r in ready {
                report(py, r);
            }
        });
    }
}

/// What a finished work reports to its done callbacks: `None`, or the exception `wait()` would
/// raise. As `wait()` does, a failure of the communicator itself runs its abort hooks (and
/// aborts the process when the communicator says so).
pub(crate) fn outcome(py: Python<'_>, work: &Work, comm: &Arc<CommCore>) -> Py<PyAny> {
    match work.error() {
        None => py.None(),
        Some(e) => {
            comm.on_failure(py, &e);
            match Err::<(), _>(e).on_rank(comm.rank) {
                Err(err) => err.into_value(py).into_any(),
                Ok(()) => py.None(),
            }
        }
    }
}

fn report(py: Python<'_>, r: Ready) {
    let error = outcome(py, &r.work, &r.comm);
    if let Err(e) = r.callback.call1(py, (error,)) {
        // Nobody to hand it to: Python's hook for unraisable exceptions reports it.
        e.write_unraisable(py, Some(r.callback.bind(py)));
    }
}
