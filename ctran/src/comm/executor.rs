//! The progress thread of one communicator: runs operations strictly in issue order, keeps
//! point-to-point transfers in flight across later operations, and turns the first fatal error
//! into the communicator's permanent state.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use super::op::Op;
use super::request::Request;
use super::Shared;
use crate::algos::select::Pick;
use crate::algos::staging::Staging;
use crate::algos::{self, OpCtx};
use crate::engine::select::{self, Path};
use crate::error::Error;
use crate::shm_collectives::{self, ShmCtx, ShmFail, Waiting};
use crate::transport::mapper::Mapper;
use crate::transport::socket::Waker;
use crate::transport::{ReqId, Transport};

/// One queued operation.
#[derive(Debug)]
pub(crate) struct Task {
    pub(crate) op: Op,
    pub(crate) seq: u64,
    pub(crate) timeout: Duration,
    pub(crate) request: Request,
    /// The explicit algorithm, or auto (resolved when the task runs).
    pub(crate) algo: Pick,
    /// Its colltrace record.
    pub(crate) trace: colltrace::OpRecord,
    /// Keeps the buffers' owners alive until the task is dropped (after it finished).
    pub(crate) _keepalive: super::KeepAlive,
}

impl Task {
    /// Releases the buffers' owners, then reports the result: a waiter that wakes up may rely
    /// on the operation holding nothing any more.
    /// Counts the task in `done` before the caller can see it finished.
    fn complete(
        self,
        log: &mut colltrace::TraceWriter,
        done: &AtomicU64,
        result: crate::error::Result<()>,
    ) {
        let Task {
            request,
            mut trace,
            _keepalive,
            ..
        } = self;
        drop(_keepalive);
        match result {
            // The caller first: the trace's end overlaps its turnaround.
            Ok(()) => log.finish_after(&mut trace, colltrace::Outcome::Completed, || {
                done.fetch_add(1, Ordering::Release);
                request.finish(Ok(()))
            }),
            Err(_) => {
                log.finish(&mut trace, super::trace::outcome(&result));
                done.fetch_add(1, Ordering::Release);
                request.finish(result);
            }
        }
    }

    /// Like [`Task::complete`] for a task that completed over shared memory with its start
    /// pinned and not recorded ([`colltrace::TraceWriter::end_pinned_after`]): tells the
    /// caller, and returns what is needed to write its record later.
    fn complete_deferred(
        self,
        log: &mut colltrace::TraceWriter,
        done: &AtomicU64,
    ) -> Option<Unwritten> {
        let Task {
            op,
            timeout,
            request,
            mut trace,
            _keepalive,
            ..
        } = self;
        drop(_keepalive);
        let ended = log.end_pinned_after(&mut trace, || {
            done.fetch_add(1, Ordering::Release);
            request.finish(Ok(()))
        })?;
        Some(Unwritten { ended, op, timeout })
    }
}

/// A completed shared-memory operation whose trace record is still to be written: the
/// progress thread writes it when it would only wait anyway (see [`Executor::write_unwritten`]).
/// It keeps the op for its sizes and types only; the buffers were released.
#[derive(Debug)]
struct Unwritten {
    ended: colltrace::Ended,
    op: Op,
    timeout: Duration,
}

/// How long the idle thread sleeps at most while only owed output (no transfer) waits for a
/// socket to take it.
const OWED_OUTPUT_SLICE: Duration = Duration::from_millis(50);

/// Records kept unwritten at most: operations that never wait leave theirs to one that does
/// (or to the idle spin), up to this many; beyond, the oldest is written after the signal.
const UNWRITTEN_MAX: usize = 4;

impl Unwritten {
    fn write(self, log: &mut colltrace::TraceWriter) {
        let Unwritten { ended, op, timeout } = self;
        let info = || super::trace::op_info(&op, timeout, None);
        log.write_ended(ended, info, Some("shm"), Some("shm"));
    }

    /// Writes the oldest record `pending` holds, if any: one per chance to wait, so that a
    /// wait that ends soon is not kept long.
    fn write_oldest(pending: &mut VecDeque<Unwritten>, log: &mut colltrace::TraceWriter) {
        if let Some(u) = pending.pop_front() {
            u.write(log);
        }
    }

    /// Writes every record `pending` holds, oldest first.
    fn write_all(pending: &mut VecDeque<Unwritten>, log: &mut colltrace::TraceWriter) {
        while let Some(u) = pending.pop_front() {
            u.write(log);
        }
    }
}

/// What the progress thread is asked to do.
pub(crate) enum Command {
    Run(Box<Task>),
    /// Finish everything queued, then exit; reply on the channel.
    Shutdown(crossbeam_channel::Sender<()>),
    /// Work of the communicator's own, run like an operation but not traced: the cost model's
    /// calibration (see [`super::calibration`]).
    Step(Step),
    /// Local work on the transports, between operations (registering buffers).
    Net(Box<dyn FnOnce(&mut Mapper) + Send>),
}

/// A step of the communicator's own work; an error fails the communicator.
pub(crate) type Step = Box<dyn FnOnce(&mut OpCtx<'_>) -> crate::error::Result<()> + Send>;

/// Point-to-point work posted to the transport and not yet finished.
#[derive(Debug)]
struct InFlight {
    reqs: Vec<ReqId>,
    task: Task,
    deadline: Instant,
}

pub(crate) struct Executor {
    pub(crate) shared: Arc<Shared>,
    pub(crate) net: Mapper,
    pub(crate) waker: Arc<Waker>,
    pub(crate) staging: Staging,
    pub(crate) rx: Receiver<Command>,
    inflight: Vec<InFlight>,
    /// The only writer of started and finished operations in the trace.
    tracer: colltrace::TraceWriter,
    /// The last shared-memory operations' records still to be written (at most
    /// [`UNWRITTEN_MAX`]).
    unwritten: VecDeque<Unwritten>,
}

impl Executor {
    pub(crate) fn new(
        shared: Arc<Shared>,
        net: Mapper,
        waker: Arc<Waker>,
        staging: Staging,
        rx: Receiver<Command>,
    ) -> Executor {
        Executor {
            tracer: shared.trace.writer(),
            shared,
            net,
            waker,
            staging,
            rx,
            inflight: Vec::new(),
            unwritten: VecDeque::with_capacity(UNWRITTEN_MAX),
        }
    }

    /// Writes the records of the last shared-memory operations that are still to be written:
    /// called where the thread only waits, and before anything else is recorded or dumped.
    fn write_unwritten(&mut self) {
        Unwritten::write_all(&mut self.unwritten, &mut self.tracer);
    }

    /// Runs the operations until the communicator ends.
    pub(crate) fn run(mut self) {
        loop {
            self.reap_inflight();
            // Registered windows take puts and signals at any time: keep reading.
            let idle = self.inflight.is_empty() && !self.net.owes_output();
            let cmd = if idle && !self.net.has_regions() {
                match self.next_command() {
                    Ok(c) => c,
                    Err(_) => break,
                }
            } else {
                match self.rx.try_recv() {
                    Ok(c) => c,
                    Err(TryRecvError::Empty) => {
                        self.progress_idle();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            };
            match cmd {
                Command::Run(task) => self.execute(*task),
                Command::Step(step) => self.run_step(step),
                Command::Net(work) => work(&mut self.net),
                Command::Shutdown(reply) => {
                    self.write_unwritten();
                    // An aborted (failed) communicator's transfers can never finish: waiting
                    // for them would hold the abort until their deadlines.
                    match self.shared.failure() {
                        Some(err) => self.fail_inflight(&err),
                        None => self.drain_inflight(),
                    }
                    let _ = reply.send(());
                    break;
                }
            }
        }
        self.write_unwritten();
        if let Some(err) = self.shared.failure() {
            // Peers learn why (an abort() by the user reads as such, not as a failure).
            self.net
                .abort(&format!("communicator shut down after a failure: {err}"));
        } else {
            self.net.close();
        }
    }

    /// The next command, spinning for the communicator's wait window before sleeping: a caller
    /// that issues operations back to back finds this thread awake.
    fn next_command(&mut self) -> Result<Command, crossbeam_channel::RecvError> {
        let rx = &self.rx;
        let poll = || match rx.try_recv() {
            Ok(c) => Some(Ok(c)),
            Err(TryRecvError::Disconnected) => Some(Err(crossbeam_channel::RecvError)),
            Err(TryRecvError::Empty) => None,
        };
        if let Some(next) = poll() {
            return next;
        }
        // Polling: the trace's anchor stays valid, refreshed every few polls, where the oldest
        // unwritten record is written too.
        let (tracer, unwritten) = (&mut self.tracer, &mut self.unwritten);
        let mark = || {
            Unwritten::write_oldest(unwritten, tracer);
            tracer.mark();
        };
        if let Some(next) = super::spin::spin_marking(self.shared.wait_spin, poll, mark) {
            return next;
        }
        self.write_unwritten();
        self.tracer.park(true);
        let next = self.rx.recv();
        self.tracer.park(false);
        next
    }

    /// Moves in-flight transfers (and output owed to peers) while no new command is queued;
    /// wakes up for new commands.
    fn progress_idle(&mut self) {
        let until = self
            .inflight
            .iter()
            .map(|f| f.deadline)
            .min()
            .unwrap_or_else(|| Instant::now() + OWED_OUTPUT_SLICE);
        self.write_unwritten();
        self.tracer.park(true);
        self.waker.set_sleeping(true);
        if self.rx.is_empty() {
            // Transport failures surface per request, in `reap_inflight`.
            let _ = self.net.progress(until, true);
        }
        self.waker.set_sleeping(false);
        self.tracer.park(false);
    }

    fn ctx(&mut self, task_op: &'static str, seq: u64, timeout: Duration) -> OpCtx<'_> {
        OpCtx::new(
            self.shared.rank,
            self.shared.size,
            task_op,
            seq,
            timeout,
            &mut self.net,
            &mut self.staging,
        )
    }

    fn execute(&mut self, mut task: Task) {
        if let Some(err) = self.shared.failure() {
            self.write_unwritten();
            task.complete(&mut self.tracer, &self.shared.tasks_done, Err(err));
            return;
        }
        task.request.start();
        let name = task.op.name();
        if task.op.moves_nothing_anywhere(task.algo.uniform) {
            self.write_unwritten();
            task.complete(&mut self.tracer, &self.shared.tasks_done, Ok(()));
            return;
        }
        if let Op::Window(_) = &task.op {
            self.run_window(task);
            return;
        }
        if !task.op.is_p2p() {
            self.net.begin_collective(task.op.tag(task.seq));
        }
        let path = select::host_path(
            &task.op,
            task.algo,
            self.net.shm_reach(),
            &self.shared.selector,
        );
        let result = match path {
            Path::P2p => {
                self.write_unwritten();
                let transport = Some(self.net.describe());
                let info = || super::trace::op_info(&task.op, task.timeout, None);
                self.tracer.start(&mut task.trace, info, transport, None);
                let posted = {
                    let mut cx = self
                        .ctx(name, task.seq, task.timeout)
                        .with_tag(task.op.tag(task.seq));
                    algos::post_p2p(&mut cx, &task.op)
                };
                match posted {
                    Ok(reqs) => {
                        let deadline = Instant::now() + task.timeout;
                        self.inflight.push(InFlight {
                            reqs,
                            task,
                            deadline,
                        });
                    }
                    Err(e) => self.fail_task(task, e),
                }
                return;
            }
            Path::ShmCollective => match self.run_on_shm(&mut task) {
                Ok(()) => {
                    let done = &self.shared.tasks_done;
                    if let Some(u) = task.complete_deferred(&mut self.tracer, done) {
                        if self.unwritten.len() == UNWRITTEN_MAX {
                            // None of the last operations waited: the oldest, after the signal.
                            Unwritten::write_oldest(&mut self.unwritten, &mut self.tracer);
                        }
                        self.unwritten.push_back(u);
                    }
                    return;
                }
                Err(e) => Err(e),
            },
            Path::Algorithm(algo) => {
                self.write_unwritten();
                let transport = Some(self.net.describe());
                let algo_name = algo.map(|a| a.name());
                let info = || super::trace::op_info(&task.op, task.timeout, None);
                self.tracer
                    .start(&mut task.trace, info, transport, algo_name);
                let mut cx = self
                    .ctx(name, task.seq, task.timeout)
                    .with_tag(task.op.tag(task.seq));
                algos::run_collective(&mut cx, &task.op, algo).and_then(|()| cx.wait_confirmed())
            }
            other => Err(Error::NotSupported(format!(
                "{name} on the {} path from the progress thread",
                other.name()
            ))),
        };
        match result {
            Ok(()) => task.complete(&mut self.tracer, &self.shared.tasks_done, Ok(())),
            Err(e) => self.fail_task(task, e),
        }
    }

    /// Runs a window operation ([`crate::window`]): puts and signals stay in flight like
    /// point-to-point transfers, the rest completes here.
    fn run_window(&mut self, mut task: Task) {
        let Op::Window(op) = &task.op else { return };
        self.write_unwritten();
        let transport = Some(self.net.describe());
        let info = || super::trace::op_info(&task.op, task.timeout, None);
        self.tracer.start(&mut task.trace, info, transport, None);
        let (rank, size) = (self.shared.rank, self.shared.size);
        let deadline = Instant::now() + task.timeout;
        let mut cx = crate::window::WinCtx {
            net: &mut self.net,
            comm: crate::transport::region::comm_id(&self.shared.name),
            rank,
            size,
            seq: task.seq,
            timeout: task.timeout,
            deadline,
        };
        let name = op.name();
        let (seq, timeout) = (task.seq, task.timeout);
        let _ = timeout;
        let err = |e| crate::algos::ctx::transport_error(name, seq, rank, e);
        match crate::window::run(&mut cx, op, err) {
            Ok(crate::window::Outcome::Done) => {
                task.complete(&mut self.tracer, &self.shared.tasks_done, Ok(()))
            }
            Ok(crate::window::Outcome::InFlight(reqs)) => self.inflight.push(InFlight {
                reqs,
                task,
                deadline,
            }),
            Err(e) => self.fail_task(task, e),
        }
    }

    /// Runs `task` as a shared-memory collective (the selector's choice: every rank is on this
    /// host and the operation has a shared-memory form).
    fn run_on_shm(&mut self, task: &mut Task) -> crate::error::Result<()> {
        let (rank, size) = (self.shared.rank, self.shared.size);
        let Some((shm, mut alive)) = self.net.whole_comm_shm() else {
            return Err(Error::NotSupported(format!(
                "{} over shared memory: some rank is on another host",
                task.op.name()
            )));
        };
        // Cut into lanes, it needs every core: its caller sleeps rather than spin.
        if shm
            .team
            .as_ref()
            .is_some_and(|t| t.likely_cuts(&task.op, size))
        {
            task.request.expect_long();
        }
        // It starts now. Trace records are written where this rank waits for its peers: the
        // oldest unwritten one when a wait begins, all of them and this one's start when a
        // wait lasts; else after the caller was told ([`Task::complete_deferred`]).
        self.tracer.pin_start(&task.trace);
        let (op, timeout, trace) = (&task.op, task.timeout, &mut task.trace);
        let (tracer, unwritten) = (&mut self.tracer, &mut self.unwritten);
        let mut waiting = |w: Waiting| {
            Unwritten::write_oldest(unwritten, tracer);
            if w == Waiting::Lasts && !trace.is_started() {
                Unwritten::write_all(unwritten, tracer);
                let info = || super::trace::op_info(op, timeout, None);
                tracer.start(trace, info, Some("shm"), Some("shm"));
            }
        };
        let mut cx = ShmCtx {
            lane: &mut shm.first,
            parts: 1,
            whole: 0,
            deadline: Instant::now() + task.timeout,
            seq: task.seq,
            alive: &mut alive,
            waiting: &mut waiting,
        };
        // Err: the op's arguments were refused before it ran.
        let outcome = shm_collectives::run(&mut cx, shm.team.as_ref(), &task.op, size);
        drop(alive);
        if matches!(outcome, Ok(Ok(()))) {
            return Ok(());
        }
        // A failure is recorded (started, then failed) before the error reaches the caller.
        waiting(Waiting::Lasts);
        outcome?.map_err(|fail| match fail {
            ShmFail::Deadline { waiting_for } => Error::Timeout {
                op: task.op.name().into(),
                seq: task.seq,
                rank,
                peer: waiting_for,
                timeout: task.timeout,
            },
            ShmFail::Mismatch { peer, detail } => Error::Mismatch {
                op: task.op.name().into(),
                seq: task.seq,
                rank,
                peer,
                detail,
            },
            ShmFail::Peer(e) => OpCtx::new(
                rank,
                size,
                task.op.name(),
                task.seq,
                task.timeout,
                &mut self.net,
                &mut self.staging,
            )
            .error(e),
        })
    }

    /// Runs a step of the communicator's own work; its failure fails the communicator, as an
    /// operation's does.
    fn run_step(&mut self, step: Step) {
        self.write_unwritten();
        let timeout = self.shared.selector.timeout;
        let result = step(&mut self.ctx("calibrate", 0, timeout));
        if let Err(e) = result {
            self.fail(e);
        }
    }

    /// Finishes in-flight point-to-point work that completed, and fails work past its deadline.
    fn reap_inflight(&mut self) {
        let mut i = 0;
        while i < self.inflight.len() {
            let f = &mut self.inflight[i];
            let mut err = None;
            while let Some(&req) = f.reqs.first() {
                match self.net.test(req) {
                    Ok(true) => {
                        f.reqs.remove(0);
                    }
                    Ok(false) => break,
                    Err(e) => {
                        let cx = OpCtx::new(
                            self.shared.rank,
                            self.shared.size,
                            f.task.op.name(),
                            f.task.seq,
                            f.task.timeout,
                            &mut self.net,
                            &mut self.staging,
                        );
                        err = Some(cx.error(e));
                        break;
                    }
                }
            }
            let f = &self.inflight[i];
            if err.is_none() && !f.reqs.is_empty() && Instant::now() >= f.deadline {
                err = Some(Error::Timeout {
                    op: f.task.op.name().into(),
                    seq: f.task.seq,
                    rank: self.shared.rank,
                    peer: self.net.peer_of(f.reqs[0]),
                    timeout: f.task.timeout,
                });
            }
            if let Some(e) = err {
                let f = self.inflight.remove(i);
                self.fail_task(f.task, e);
                return;
            }
            if f.reqs.is_empty() {
                let f = self.inflight.remove(i);
                f.task
                    .complete(&mut self.tracer, &self.shared.tasks_done, Ok(()));
            } else {
                i += 1;
            }
        }
    }

    fn drain_inflight(&mut self) {
        while !self.inflight.is_empty() {
            let until = self
                .inflight
                .iter()
                .map(|f| f.deadline)
                .min()
                .unwrap_or_else(Instant::now);
            // Failures surface per request in `reap_inflight`, which also enforces deadlines.
            let _ = self.net.progress(until, false);
            self.reap_inflight();
        }
    }

    /// Fails every in-flight transfer with `err`: after a failure none can finish.
    fn fail_inflight(&mut self, err: &Error) {
        for f in self.inflight.drain(..) {
            f.task
                .complete(&mut self.tracer, &self.shared.tasks_done, Err(err.clone()));
        }
    }

    fn fail_task(&mut self, mut task: Task, err: Error) {
        tracing::error!(comm = %self.shared.name, rank = self.shared.rank, "{err}");
        // The trace shows this op failed before the failure dumps it; the caller wakes after
        // the dump, so a process that exits on the error still leaves it behind.
        let result = Err(err.clone());
        self.tracer
            .finish(&mut task.trace, super::trace::outcome(&result));
        self.fail(err);
        task.complete(&mut self.tracer, &self.shared.tasks_done, result);
    }

    /// Marks the communicator failed, closes its connections (peers notice at once), fails
    /// everything in flight, and dumps the trace (`TORCHCOMMS_TRACE_DUMP_ON`).
    fn fail(&mut self, err: Error) {
        self.write_unwritten();
        let wrapped = self.shared.set_failed(err.clone());
        self.net.abort(&err.to_string());
        self.fail_inflight(&wrapped);
        super::trace::report_failure(&self.shared.trace, &err);
        if self.shared.abort_process_on_error {
            tracing::error!(
                comm = %self.shared.name,
                rank = self.shared.rank,
                "aborting the process (abort_process_on_timeout_or_error is set): {err}"
            );
            std::process::abort();
        }
    }
}
