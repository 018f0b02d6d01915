//! Work handles with ProcessGroupNCCL's stream semantics, and the watchdog that keeps tensors
//! alive until their operation is done and aborts the communicator on timeout or error.
//!
//! - An operation runs on the communicator's stream after the caller's stream (an event
//!   recorded on the caller's stream, waited on by ours) and records `done` on ours.
//! - [`WorkHandle::wait`] makes the caller's stream wait for `done`: it returns at once, and
//!   work the caller issues next on its stream runs after the operation. (A barrier's wait
//!   blocks the host, like ProcessGroupNCCL's.)
//! - [`WorkHandle::wait_blocking`] blocks the host until `done`, the deadline, or a failure.
//! - The watchdog thread holds each operation's tensor owners until its `done` completes, so a
//!   tensor dropped right after issuing stays allocated while the GPU uses it. An operation
//!   older than its timeout, an asynchronous NCCL error, or another rank's abort notice fails
//!   the communicator: `ncclCommAbort`, and every later call on this rank returns the error.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use torchcomms::{Error, Result, WorkHandle, WorkStatus};
use torchcomms_cuda::RawStream;

use crate::gpu::GpuEvent;

use crate::comm::Shared;
use crate::error::NcclError;

/// What keeps an operation's buffers alive.
pub(crate) type KeepAlive = Vec<Arc<dyn std::any::Any + Send + Sync>>;

/// An operation the watchdog follows.
pub(crate) struct Pending {
    pub(crate) event: Arc<GpuEvent>,
    pub(crate) keep: KeepAlive,
    pub(crate) issued: Instant,
    pub(crate) timeout: Duration,
    pub(crate) op: &'static str,
    pub(crate) seq: u64,
}

enum Msg {
    Track(Pending),
    Stop,
}

/// The watchdog thread of one communicator.
#[derive(Debug)]
pub(crate) struct Watchdog {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<()>>,
    /// Disconnected when the thread ends (its sender drops with it, panic or not).
    ended: Receiver<()>,
}

/// How long dropping a watchdog waits for its thread before leaving it behind.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// How often the watchdog polls events while operations are in flight.
const POLL: Duration = Duration::from_micros(500);
/// How often it asks NCCL and the store for errors.
const HEALTH: Duration = Duration::from_millis(250);

impl Watchdog {
    pub(crate) fn start(shared: Arc<Shared>) -> Result<Watchdog, NcclError> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (alive, ended) = crossbeam_channel::bounded::<()>(0);
        let name = format!("nccl-wd-{}", shared.rank);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || {
                let _alive = alive;
                run(&shared, &rx);
            })
            .map_err(|e| NcclError::NotSupported(format!("cannot start the watchdog: {e}")))?;
        Ok(Watchdog {
            tx,
            thread: Some(thread),
            ended,
        })
    }

    pub(crate) fn track(&self, p: Pending) {
        if let Err(crossbeam_channel::SendError(Msg::Track(p))) = self.tx.send(Msg::Track(p)) {
            // The thread is gone (it only stops on Stop): keep the buffers forever rather than
            // free memory the GPU may still use.
            std::mem::forget(p.keep);
        }
    }
}

impl Drop for Watchdog {
    /// Stops the thread and waits for it a bounded time: a watchdog dropped while the Python
    /// interpreter shuts down (the last owner was a Python object) may be stuck on the
    /// interpreter in a store call, and waiting for it forever would hang the process's exit.
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        let Some(t) = self.thread.take() else { return };
        match self.ended.recv_timeout(STOP_WAIT) {
            Err(RecvTimeoutError::Disconnected) => {
                if t.join().is_err() {
                    tracing::warn!("the NCCL watchdog thread panicked");
                }
            }
            Ok(()) | Err(RecvTimeoutError::Timeout) => {
                tracing::warn!(
                    "the NCCL watchdog thread did not stop within {STOP_WAIT:?}; left behind"
                );
            }
        }
    }
}

fn run(s: &Shared, rx: &Receiver<Msg>) {
    if let Err(e) = s.gpu.bind() {
        tracing::error!("watchdog: {e}");
    }
    // The user may capture a graph (global mode) while we poll events: stay exempt.
    if let Err(e) = s.gpu.relax_capture_mode_for_this_thread() {
        tracing::warn!("watchdog: cannot relax the stream capture mode: {e}");
    }
    let mut queue: VecDeque<Pending> = VecDeque::new();
    let mut last_health = Instant::now();
    let mut stopping = false;
    loop {
        // Take new operations: block while idle, poll while busy.
        let msg = if queue.is_empty() && !stopping {
            match rx.recv_timeout(HEALTH) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(Msg::Stop),
            }
        } else {
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => Some(Msg::Stop),
            }
        };
        match msg {
            Some(Msg::Track(p)) => {
                queue.push_back(p);
                continue;
            }
            Some(Msg::Stop) => stopping = true,
            None => {}
        }
        // Retire what finished (a stream completes in order: stop at the first busy one).
        while let Some(front) = queue.front() {
            match front.event.query() {
                Ok(true) => {
                    queue.pop_front();
                }
                Ok(false) => {
                    if front.issued.elapsed() > front.timeout && s.failure().is_none() {
                        s.fail(
                            NcclError::Timeout {
                                op: front.op.into(),
                                seq: front.seq,
                                rank: s.rank,
                                comm: s.name.clone(),
                                timeout: front.timeout,
                            },
                            true,
                        );
                    }
                    break;
                }
                Err(e) => {
                    s.fail(s.gpu_err(front.op, e), true);
                    break;
                }
            }
        }
        if last_health.elapsed() >= HEALTH {
            last_health = Instant::now();
            health(s);
        }
        if s.failure().is_some() && !queue.is_empty() {
            settle(&mut queue);
        }
        if stopping && queue.is_empty() {
            return;
        }
        if !queue.is_empty() {
            std::thread::sleep(POLL);
        }
    }
}

/// Asynchronous NCCL errors and other ranks' abort notices.
fn health(s: &Shared) {
    // Once finalized there is nothing to watch. The abort channel's store may be a Python
    // object: touching it then could wait for an interpreter that is shutting down.
    if s.failure().is_some() || s.is_destroyed() {
        return;
    }
    if let Some(e) = s.async_error() {
        s.fail(e, true);
        return;
    }
    if let Some(ch) = &s.abort_channel {
        if let Ok(true) = ch.store.check(&[ch.key.as_str()]) {
            let why = ch
                .store
                .get(&ch.key, Duration::from_secs(5))
                .map(|v| String::from_utf8_lossy(&v).into_owned())
                .unwrap_or_else(|e| format!("(cannot read why: {e})"));
            s.fail(
                NcclError::Aborted {
                    comm: s.name.clone(),
                    rank: s.rank,
                    reason: format!("another rank aborted the communicator: {why}"),
                },
                false,
            );
        }
    }
}

/// After an abort: give the stream a moment to drain, then keep (leak) the buffers of whatever
/// has not finished rather than free memory a kernel might still touch.
fn settle(queue: &mut VecDeque<Pending>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Some(front) = queue.front() {
        match front.event.query() {
            Ok(true) | Err(_) => {
                queue.pop_front();
            }
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(false) => break,
        }
    }
    for p in queue.drain(..) {
        tracing::warn!(
            op = p.op,
            seq = p.seq,
            "buffers of an aborted operation kept"
        );
        std::mem::forget(p.keep);
    }
}

/// The work handle of one operation.
#[derive(Debug)]
pub(crate) struct NcclWork {
    pub(crate) shared: Arc<Shared>,
    pub(crate) event: Arc<GpuEvent>,
    pub(crate) caller: RawStream,
    pub(crate) op: &'static str,
    /// Barriers block the host in `wait()`.
    pub(crate) blocking: bool,
    pub(crate) issued: Instant,
    /// Issued while the caller's stream captured a graph: it runs at each replay, which the
    /// graph's owner waits for; the handle has nothing to poll (like ProcessGroupNCCL's).
    pub(crate) captured: bool,
}

impl NcclWork {
    fn failed(&self) -> Option<Error> {
        self.shared.failure().map(Error::from)
    }
}

impl WorkHandle for NcclWork {
    fn wait(&self, timeout: Duration) -> Result<()> {
        if self.blocking {
            return self.wait_blocking(timeout);
        }
        if let Some(e) = self.failed() {
            return Err(e);
        }
        self.event
            .wait_on(self.caller)
            .map_err(|e| self.shared.gpu_err(self.op, e).into())
    }

    fn wait_on_stream(&self, stream: u64, timeout: Duration) -> Result<()> {
        if self.blocking {
            return self.wait_blocking(timeout);
        }
        if let Some(e) = self.failed() {
            return Err(e);
        }
        self.event
            .wait_on(RawStream(stream))
            .map_err(|e| self.shared.gpu_err(self.op, e).into())
    }

    fn wait_blocking(&self, timeout: Duration) -> Result<()> {
        if self.captured {
            return Ok(());
        }
        let start = Instant::now();
        let mut nap = Duration::from_micros(2);
        loop {
            match self.event.query() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(self.shared.gpu_err(self.op, e).into()),
            }
            if let Some(e) = self.failed() {
                return Err(e);
            }
            if start.elapsed() > timeout {
                return Err(Error::WaitTimeout {
                    op: self.op.into(),
                    rank: self.shared.rank,
                    timeout,
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_micros(200));
        }
    }

    fn status(&self) -> WorkStatus {
        if self.captured {
            return WorkStatus::Completed;
        }
        match self.event.query() {
            Ok(true) => WorkStatus::Completed,
            Ok(false) => match self.shared.failure() {
                Some(NcclError::Timeout { .. }) => WorkStatus::TimedOut,
                Some(_) => WorkStatus::Error,
                None if self.issued.elapsed() > Duration::ZERO => WorkStatus::InProgress,
                None => WorkStatus::NotStarted,
            },
            Err(_) => WorkStatus::Error,
        }
    }

    fn error(&self) -> Option<Error> {
        if self.captured {
            return None;
        }
        match self.event.query() {
            Ok(true) => None,
            _ => self.failed(),
        }
    }
}
