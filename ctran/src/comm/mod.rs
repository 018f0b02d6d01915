//! The communicator: a group of ranks connected by transports, running operations in issue
//! order on its own progress thread.

mod buffers;
mod calibration;
pub mod config;
mod cpus;
mod executor;
mod init;
pub mod op;
pub mod request;
mod spin;
pub(crate) mod stable_hash;
mod trace;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::algos::select::{CostModel, Hints, Selector};
use crate::algos::staging::Staging;
use crate::bootstrap::Store;
use crate::error::{Error, Result};
use crate::span::Span;
use crate::transport::mapper::Mapper;
use crate::transport::socket::Waker;
pub use config::CommConfig;
use executor::{Command, Executor, Task};
#[cfg(feature = "fuzzing")]
pub(crate) use init::fuzz_records;
pub(crate) use init::host_id;
pub use op::{Op, P2p};
pub use request::{FinishCallback, Request, RequestStatus};

/// Owners of an operation's buffers, dropped by the progress thread once the operation finished.
pub type KeepAlive = Vec<Arc<dyn std::any::Any + Send + Sync>>;

/// State shared by the communicator handle and its progress thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) abort_process_on_error: bool,
    /// Algorithm choices and the agreed cost model (set at creation, see [`calibration`]).
    pub(crate) selector: Arc<Selector>,
    /// colltrace of this communicator.
    pub(crate) trace: Arc<colltrace::CommTrace>,
    /// How long a waiting caller and the idle progress thread spin before they sleep.
    pub(crate) wait_spin: Duration,
    /// Cores of this rank's host: the union of its ranks' CPU sets (see [`cpus`]).
    pub(crate) host_cores: usize,
    /// Tasks the progress thread finished, counted before their callers are told: when it
    /// equals [`Submitter::sent`], nothing submitted is unfinished.
    pub(crate) tasks_done: AtomicU64,
    failed: Mutex<Option<Error>>,
}

impl Shared {
    /// The error that broke the communicator, if any, wrapped for new callers.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records the first fatal error; returns what later callers will see.
    pub(crate) fn set_failed(&self, cause: Error) -> Error {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert_with(|| match cause {
            e @ Error::CommFailed { .. } => e,
            e => Error::CommFailed {
                comm: self.name.clone(),
                cause: Box::new(e),
            },
        })
        .clone()
    }
}

/// Issue order: sequence numbers and the queue must advance together, also when several
/// threads submit at once.
#[derive(Debug)]
struct Submitter {
    tx: Sender<Command>,
    coll_seq: u64,
    p2p_seq: u64,
    /// Tasks handed to the progress thread.
    sent: u64,
    /// The thread inside an issue call and how deeply (see [`Comm::claim_issuer`]).
    issuing: Option<(std::thread::ThreadId, u32)>,
}

/// A communicator of the ctran engine.
///
/// Operations are submitted with [`Comm::submit`] and run in submission order; all ranks must
/// submit collectives in the same order. The buffers of an operation must stay valid until its
/// [`Request`] completes.
#[derive(Debug)]
pub struct Comm {
    shared: Arc<Shared>,
    config: CommConfig,
    submitter: Mutex<Submitter>,
    waker: Arc<Waker>,
    thread: Mutex<Option<JoinHandle<()>>>,
    finalized: AtomicBool,
}

impl Comm {
    /// Creates the communicator: exchanges addresses through `store` (keys prefixed with the
    /// communicator's name), connects every pair of ranks, and returns once all ranks have.
    /// After it returns the store is no longer needed.
    pub fn init(config: CommConfig, store: Arc<dyn Store>) -> Result<Comm> {
        init::init_with_store(config, store)
    }

    fn start(
        config: CommConfig,
        transport: Mapper,
        host_cores: usize,
        waker: Arc<Waker>,
        trace: Arc<colltrace::CommTrace>,
    ) -> Result<Comm> {
        trace.set_connected(transport.describe());
        let shared = Arc::new(Shared {
            name: config.name.clone(),
            rank: config.rank,
            size: config.size,
            abort_process_on_error: config.abort_process_on_error,
            selector: Arc::new(Selector::new(
                config.size,
                config.chunk_bytes,
                config.algos.clone(),
                config.timeout,
            )),
            failed: Mutex::new(None),
            trace,
            wait_spin: config.wait_spin.unwrap_or(Duration::ZERO),
            host_cores,
            tasks_done: AtomicU64::new(0),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let exec = Executor::new(
            Arc::clone(&shared),
            transport,
            Arc::clone(&waker),
            Staging::new(config.chunk_bytes),
            rx,
        );
        let thread = std::thread::Builder::new()
            .name(format!("ctran-{}-r{}", config.name, config.rank))
            .spawn(move || exec.run())
            .map_err(|e| Error::io("spawning the progress thread", e))?;
        let comm = Comm {
            shared,
            config,
            submitter: Mutex::new(Submitter {
                tx,
                coll_seq: 0,
                p2p_seq: 0,
                issuing: None,
                sent: 0,
            }),
            waker,
            thread: Mutex::new(Some(thread)),
            finalized: AtomicBool::new(false),
        };
        // The cost model is measured before the caller goes on with its own start-up work
        // (allocating and filling buffers), which competes for the cores: measured alongside
        // it, a probe can take tens of times its usual few microseconds, and the model would
        // be fitted to that. A failure there fails the first operation.
        calibration::calibrate(&comm);
        Ok(comm)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// Name given at creation.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The configuration this communicator runs with.
    pub fn config(&self) -> &CommConfig {
        &self.config
    }

    /// The error that made this communicator unusable, if any.
    pub fn failure(&self) -> Option<Error> {
        self.shared.failure()
    }

    /// Queues `op`; it runs after every operation submitted before it. `timeout` overrides the
    /// communicator's default. Errors (finalized or failed communicator) come back through the
    /// returned request.
    pub fn submit(&self, op: Op, timeout: Option<Duration>) -> Request {
        self.submit_with(op, timeout, Vec::new())
    }

    /// Like [`Comm::submit`], and holds `keepalive` (the owners of the operation's buffers, a
    /// tensor say) until the operation finished, even if the caller drops the request.
    pub fn submit_with(&self, op: Op, timeout: Option<Duration>, keepalive: KeepAlive) -> Request {
        self.submit_with_algo(op, timeout, keepalive, None)
    }

    /// Like [`Comm::submit_with`], running the collective with the algorithm named `algo` (the
    /// per-call hint; `None` uses `CTRAN_<COLLECTIVE>_ALGO`, else `auto`). An unknown name, or
    /// one that cannot run this call, fails the request at once with
    /// [`Error::InvalidArgument`] listing the valid names; the communicator stays usable.
    /// Point-to-point operations ignore `algo`. See [`crate::algos::select`].
    pub fn submit_with_algo(
        &self,
        op: Op,
        timeout: Option<Duration>,
        keepalive: KeepAlive,
        algo: Option<&str>,
    ) -> Request {
        self.submit_with_options(op, timeout, keepalive, algo, None)
    }

    /// Like [`Comm::submit_with_algo`], with everything the caller says about the call:
    /// `hints` for the algorithm choice (the name, as `Some("ring")`, or [`Hints`], which can
    /// also declare that every rank passes equal blocks), and whether the caller issued the
    /// operation asynchronously, for the trace (`None`: unknown).
    pub fn submit_with_options<'a>(
        &self,
        op: Op,
        timeout: Option<Duration>,
        keepalive: KeepAlive,
        hints: impl Into<Hints<'a>>,
        async_op: Option<bool>,
    ) -> Request {
        let name = op.name();
        let algo = match self.shared.selector.choose(&op, hints.into()) {
            Ok(choice) => choice,
            Err(e) => return Request::failed(name, 0, e),
        };
        if self.finalized.load(Ordering::Acquire) {
            let err = Error::Finalized {
                op: name.into(),
                comm: self.shared.name.clone(),
            };
            return Request::failed(name, 0, err);
        }
        let mut sub = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
        let seq = if op.is_p2p() {
            sub.p2p_seq += 1;
            sub.p2p_seq
        } else {
            sub.coll_seq += 1;
            sub.coll_seq
        };
        let timeout = timeout.unwrap_or(self.config.timeout);
        let traced = self
            .shared
            .trace
            .submit(op.is_p2p(), seq, name, async_op, timeout);
        if let Some(err) = self.shared.failure() {
            self.shared.trace.refuse(traced, &err);
            return Request::failed(name, seq, err);
        }
        // A collective that moves nothing completes here, in issue order (after everything
        // submitted before it), as NCCL returns at once for a count of 0: handing it to the
        // progress thread cost 6-75 us on 4 ranks of 2 cores.
        if op.moves_nothing_anywhere(algo.uniform)
            && self.shared.tasks_done.load(Ordering::Acquire) == sub.sent
        {
            drop(sub);
            drop(keepalive);
            self.shared.trace.complete_inline(traced);
            return Request::completed(name, seq);
        }
        // Shown as queued once the task is on its way: off the caller's critical path.
        let queued = traced.queued();
        let request = Request::new(name, seq, self.shared.wait_spin)
            .noting(traced.waited(&self.shared.trace));
        let task = Task {
            op,
            seq,
            timeout,
            request: request.clone(),
            algo,
            trace: traced,
            _keepalive: keepalive,
        };
        if let Err(crossbeam_channel::SendError(cmd)) = sub.tx.send(Command::Run(Box::new(task))) {
            let err = Error::CommFailed {
                comm: self.shared.name.clone(),
                cause: Box::new(Error::NotSupported(
                    "operations after the progress thread stopped".into(),
                )),
            };
            if let Command::Run(task) = cmd {
                self.shared.trace.refuse(task.trace, &err);
            }
            return Request::failed(name, seq, err);
        }
        sub.sent += 1;
        drop(sub);
        self.waker.wake();
        self.shared.trace.publish(queued);
        request
    }

    /// Marks the calling thread as issuing `op` until the guard drops, and refuses `op` when
    /// another thread is issuing at the same moment. Ranks pair operations by issue order, which
    /// two threads issuing concurrently interleave differently on each rank: the results would
    /// be silently mixed. As NCCL documents, a communicator takes operations from one thread at
    /// a time; here an overlap that happens is detected, and the communicator is aborted so the
    /// peers fail too instead of pairing what is left. Threads that take turns keep the order
    /// the same on every rank, also while the other thread's operations are still in flight
    /// (PyTorch's autograd thread issues backward's collectives after the main thread's), so
    /// that is allowed.
    pub fn claim_issuer(&self, op: &str) -> Result<IssueGuard<'_>> {
        let me = std::thread::current().id();
        let mut sub = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
        match &mut sub.issuing {
            Some((t, depth)) if *t == me => *depth += 1,
            Some(_) => {
                drop(sub);
                let reason = format!(
                    "{op} was issued from a second thread while another thread was issuing on \
                     the same communicator; ranks could pair the two threads' operations \
                     differently, so the communicator is aborted (issue a communicator's \
                     operations from one thread at a time)"
                );
                self.abort(&reason);
                return Err(Error::Aborted {
                    comm: self.shared.name.clone(),
                    reason,
                });
            }
            None => sub.issuing = Some((me, 1)),
        }
        Ok(IssueGuard { comm: self })
    }

    /// The algorithm `op` would run with, given the hints (`Some("ring")`, `None`, or
    /// [`Hints`]; see [`Comm::submit_with_options`]): the explicit choice, or the cost model's
    /// (cached) pick. `None` for point-to-point operations.
    pub fn algo_for<'a>(
        &self,
        op: &Op,
        hints: impl Into<Hints<'a>>,
    ) -> Result<Option<&'static str>> {
        let sel = &self.shared.selector;
        let pick = sel.choose(op, hints.into())?;
        Ok(sel.resolve(op, pick).map(|a| a.name()))
    }

    /// The cost model all ranks agreed on at creation.
    pub fn cost_model(&self) -> Option<CostModel> {
        self.shared.selector.model()
    }

    /// Submits `op` and waits for it.
    pub fn run(&self, op: Op, timeout: Option<Duration>) -> Result<()> {
        let t = timeout.unwrap_or(self.config.timeout);
        // The engine enforces the deadline; the extra second only covers a wedged thread.
        self.submit(op, Some(t))
            .wait_timeout(t + Duration::from_secs(1), self.rank())
    }

    /// Host all-gather of one equal-sized byte record per rank, for setup exchanges: the
    /// records of ranks 0, 1, ... one after the other.
    pub(crate) fn all_gather_bytes(
        &self,
        mine: &[u8],
        timeout: Option<Duration>,
    ) -> Result<Vec<u8>> {
        let len = mine.len();
        let mut input = mine.to_vec();
        let mut gathered = vec![0u8; len * self.size()];
        // SAFETY: `input` and `gathered` live on this frame until `run` returns, which is after
        // the operation completed or failed for good.
        let (input_span, out_span) = unsafe {
            (
                Span::from_slice(&mut input),
                Span::from_slice(&mut gathered),
            )
        };
        let outputs = (0..self.size())
            .map(|r| out_span.sub(r * len, len))
            .collect();
        self.run(
            Op::AllGather {
                input: input_span,
                outputs,
            },
            timeout,
        )?;
        Ok(gathered)
    }

    /// Creates a sub-communicator of the ranks in `ranks` (indices into this communicator),
    /// named `name`. Every rank of this communicator must call it; ranks not joining pass an
    /// empty list and get `None`. The new rank is the position of this rank in `ranks`.
    pub fn split(
        &self,
        ranks: &[usize],
        name: &str,
        timeout: Option<Duration>,
        abort_process_on_error: bool,
    ) -> Result<Option<Comm>> {
        let timeout = timeout.unwrap_or(self.config.timeout);
        init::split(self, ranks, name, timeout, abort_process_on_error)
    }

    /// Waits for every queued operation, then closes connections. Further operations fail.
    /// Idempotent.
    pub fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let result = if self.shared.failure().is_none() {
            // A barrier, so no rank closes its sockets while a peer still reads from them.
            let req = self.submit_internal(Op::Barrier);
            req.wait_timeout(self.config.timeout + Duration::from_secs(1), self.rank())
        } else {
            Ok(())
        };
        self.stop_thread();
        self.shared
            .trace
            .set_state(colltrace::CommState::Finalized, None);
        result
    }

    fn submit_internal(&self, op: Op) -> Request {
        self.finalized.store(false, Ordering::Release);
        let r = self.submit(op, None);
        self.finalized.store(true, Ordering::Release);
        r
    }

    /// Hands `command` to the progress thread and wakes it; false if the thread has stopped.
    fn send_command(&self, command: Command) -> bool {
        let sent = {
            let sub = self.submitter.lock().unwrap_or_else(|p| p.into_inner());
            sub.tx.send(command).is_ok()
        };
        self.waker.wake();
        sent
    }

    fn stop_thread(&self) {
        let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
        if self.send_command(Command::Shutdown(reply_tx)) {
            let _ = reply_rx.recv_timeout(self.config.timeout + Duration::from_secs(1));
        }
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }

    /// True after [`Comm::finalize`].
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Marks the communicator failed with `reason`: queued and future operations fail, and peers
    /// see this rank's connections close.
    pub fn abort(&self, reason: &str) {
        self.shared.set_failed(Error::Aborted {
            comm: self.shared.name.clone(),
            reason: reason.into(),
        });
        // Later operations fail with the abort (through the failure state), not as if the
        // communicator had been finalized.
        self.stop_thread();
        colltrace::on_failure(&self.shared.trace, colltrace::Trigger::Abort, reason);
    }

    /// The colltrace of this communicator (its records, counters and identity).
    pub fn trace(&self) -> &Arc<colltrace::CommTrace> {
        &self.shared.trace
    }

    /// Writes this communicator's trace into `dir` (`colltrace_rank<N>_<name>_<instance>.json`);
    /// [`colltrace::dump_all`] writes every communicator of the process.
    pub fn dump_trace(&self, dir: &std::path::Path) -> Result<std::path::PathBuf> {
        self.shared
            .trace
            .dump_to(dir, colltrace::Trigger::Api, Some("Comm::dump_trace"))
            .map_err(|e| match e {
                colltrace::Error::Io { path, source } => Error::Io {
                    context: format!("writing colltrace dump {}", path.display()),
                    source,
                },
                other => Error::NotSupported(other.to_string()),
            })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Dropping without finalize() is not an error: queued work still runs, then the
        // connections close.
        if self.thread.get_mut().map(|t| t.is_some()).unwrap_or(false) {
            self.stop_thread();
        }
    }
}

/// A thread's turn at issuing on a communicator (see [`Comm::claim_issuer`]); the turn ends
/// when the guard drops.
#[derive(Debug)]
#[must_use = "the turn ends when the guard drops"]
pub struct IssueGuard<'a> {
    comm: &'a Comm,
}

impl Drop for IssueGuard<'_> {
    fn drop(&mut self) {
        let mut sub = self
            .comm
            .submitter
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some((_, depth)) = &mut sub.issuing {
            *depth -= 1;
            if *depth == 0 {
                sub.issuing = None;
            }
        }
    }
}
