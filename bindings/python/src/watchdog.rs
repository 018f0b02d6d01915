//! The watchdog, as upstream's: it notices a failed or timed-out operation whether or not Python
//! ever waits on it, marks the process unhealthy (the `torchcomms_health_check` handler), and,
//! for a communicator created with `abort_process_on_timeout_or_error`, runs the abort hooks and
//! aborts the process.
//!
//! Two paths lead there. A failure Python sees (a synchronous operation, `wait()`) is handled on
//! the calling thread ([`abort_process`] with the GIL held). Works of the engine are also
//! followed by one process-wide watchdog thread that polls their status while any is in flight
//! (it sleeps on a condition variable otherwise); when one failed, it runs the communicator's
//! abort hooks (attaching to the interpreter, with a deadline, so a thread that never releases
//! the GIL cannot keep the process alive) and aborts. Only the first failure does this; any
//! other thread that gets there blocks until the process ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use pyo3::prelude::*;
use torchcomms::{Work, WorkStatus};

use crate::core::CommCore;

/// How often the watchdog looks at works in flight.
const POLL: Duration = Duration::from_millis(50);

/// How long the watchdog waits for the abort hooks (they need the GIL) before it aborts
/// anyway, on top of `TORCHCOMM_HEALTH_CHECK_WAIT_MS` (a flight recorder's abort hook sleeps
/// that long so a debug server can pull a dump).
const HOOK_GRACE: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Watched {
    work: Arc<Work>,
    comm: Weak<CommCore>,
}

#[derive(Debug, Default)]
struct Watchdog {
    works: Mutex<Vec<Watched>>,
    more: Condvar,
}

fn watchdog() -> &'static Watchdog {
    static W: OnceLock<Watchdog> = OnceLock::new();
    static STARTED: OnceLock<()> = OnceLock::new();
    let w = W.get_or_init(Watchdog::default);
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("torchcomms-watchdog".into())
            .spawn(|| run(W.get().expect("initialised above")));
        if let Err(e) = spawned {
            // Failures still abort when Python sees them.
            tracing::error!("torchcomms: cannot start the watchdog thread: {e}");
        }
    });
    w
}

/// Follows `work` (an operation of `comm`) until it finished; finished works are not kept.
pub(crate) fn watch(work: &Arc<Work>, comm: &Arc<CommCore>) {
    // A host operation has often finished by now, and asking is cheap. A CUDA one is stream
    // ordered and has not: asking would cost an event query on every call, so the sweep asks.
    if !comm.stream_ordered() && work.is_completed() && work.status() == WorkStatus::Completed {
        return;
    }
    let w = watchdog();
    let mut works = w.works.lock().unwrap_or_else(|p| p.into_inner());
    // The thread waits on the condition only while the list is empty, and a notification is
    // a system call whether or not anyone waits: wake it only for the first work.
    let was_empty = works.is_empty();
    works.push(Watched {
        work: Arc::clone(work),
        comm: Arc::downgrade(comm),
    });
    drop(works);
    if was_empty {
        w.more.notify_one();
    }
}

fn run(w: &'static Watchdog) {
    loop {
        // The works are polled outside the lock, so issuing threads never wait for a sweep.
        let mut works = {
            let mut works = w.works.lock().unwrap_or_else(|p| p.into_inner());
            while works.is_empty() {
                works = w.more.wait(works).unwrap_or_else(|p| p.into_inner());
            }
            std::mem::take(&mut *works)
        };
        let mut failed: Option<(Arc<CommCore>, torchcomms::Error)> = None;
        works.retain(|x| match x.work.status() {
            WorkStatus::Completed => false,
            WorkStatus::Error | WorkStatus::TimedOut => {
                if let (None, Some(comm), Some(err)) = (&failed, x.comm.upgrade(), x.work.error()) {
                    failed = Some((comm, err));
                }
                false
            }
            // A communicator that is gone stopped caring (upstream's watchdog dies with it).
            WorkStatus::NotStarted | WorkStatus::InProgress => x.comm.strong_count() > 0,
        });
        if !works.is_empty() {
            // Still in flight, ahead of what was issued during the sweep.
            let mut list = w.works.lock().unwrap_or_else(|p| p.into_inner());
            works.append(&mut list);
            *list = works;
        }
        if let Some((comm, err)) = failed {
            if comm.is_fatal(&err) {
                set_unhealthy();
                if comm.aborts_process() {
                    abort_process(None, &comm, &err);
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

static ABORTING: AtomicBool = AtomicBool::new(false);

/// Set once any communicator of this process failed or timed out (upstream's
/// `TorchCommsHealthCheck`).
static UNHEALTHY: AtomicBool = AtomicBool::new(false);

/// Records that a communicator failed.
pub(crate) fn set_unhealthy() {
    UNHEALTHY.store(true, Ordering::Release);
}

/// False once any communicator of this process failed or timed out (the
/// `torchcomms_health_check` control-plane handler reports it).
#[pyfunction]
pub(crate) fn _health_check() -> bool {
    !UNHEALTHY.load(Ordering::Acquire)
}

/// `TORCHCOMM_HEALTH_CHECK_WAIT_MS` (unset or invalid: no wait): how long the abort hooks may
/// sleep on top of their grace period.
fn health_check_wait() -> Duration {
    torchcomms_cvars::Cvars::load()
        .ok()
        .and_then(|cv| cv.torchcomm_health_check_wait_ms())
        .unwrap_or_default()
}

fn flush_python(py: Python<'_>) {
    for stream in ["stdout", "stderr"] {
        let _ = py
            .import("sys")
            .and_then(|sys| sys.getattr(stream))
            .and_then(|s| s.call_method0("flush"));
    }
}

/// Runs `comm`'s abort hooks (once) and aborts the process. `py` is the caller's GIL token
/// when it has one (the failure reached Python); the watchdog passes `None`.
pub(crate) fn abort_process(
    py: Option<Python<'_>>,
    comm: &Arc<CommCore>,
    err: &dyn std::fmt::Display,
) -> ! {
    if ABORTING.swap(true, Ordering::AcqRel) {
        // Another thread is running the hooks and will abort: wait for it, without the GIL.
        fn forever() {
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        match py {
            Some(py) => py.detach(forever),
            None => forever(),
        }
    }
    let who = if py.is_some() { "" } else { " (watchdog)" };
    tracing::error!(comm = %comm.name, rank = comm.rank, "{err}");
    eprintln!(
        "torchcomms: aborting the process (abort_process_on_timeout_or_error=True) after an \
         error on communicator `{}`, rank {}{who}: {err}",
        comm.name, comm.rank
    );
    match py {
        Some(py) => {
            comm.run_abort_hooks_once(py);
            flush_python(py);
        }
        None => {
            let (tx, rx) = std::sync::mpsc::channel();
            let c = Arc::clone(comm);
            let spawned = std::thread::Builder::new()
                .name("torchcomms-abort-hooks".into())
                .spawn(move || {
                    let _ = Python::try_attach(|py| {
                        c.run_abort_hooks_once(py);
                        flush_python(py);
                    });
                    let _ = tx.send(());
                });
            if spawned.is_ok() {
                let limit = HOOK_GRACE + health_check_wait();
                if rx.recv_timeout(limit).is_err() {
                    eprintln!(
                        "torchcomms: the abort hooks did not finish within {limit:?} (is a thread \
                         holding the GIL?); aborting without them"
                    );
                }
            }
        }
    }
    std::process::abort();
}
