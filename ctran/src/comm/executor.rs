//! The progress thread of one communicator: runs operations strictly in issue order, keeps
//! point-to-point transfers in flight across later operations, and turns the first fatal error
//! into the communicator's permanent state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, TryRecvError};

use super::op::Op;
use super::request::Request;
use super::Shared;
use crate::algos::staging::Staging;
use crate::algos::{self, OpCtx};
use crate::error::Error;
use crate::transport::socket::Waker;
use crate::transport::{ReqId, Transport};

/// One queued operation.
#[derive(Debug)]
pub(crate) struct Task {
    pub(crate) op: Op,
    pub(crate) seq: u64,
    pub(crate) timeout: Duration,
    pub(crate) request: Request,
    /// Keeps the buffers' owners alive until the task is dropped (after it finished).
    pub(crate) _keepalive: super::KeepAlive,
}

impl Task {
    /// Releases the buffers' owners, then reports the result: a waiter that wakes up may rely
    /// on the operation holding nothing any more.
    fn complete(self, result: crate::error::Result<()>) {
        let Task {
            request,
            _keepalive,
            ..
        } = self;
        drop(_keepalive);
        request.finish(result);
    }
}

/// What the progress thread is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    Run(Task),
    /// Finish everything queued, then exit; reply on the channel.
    Shutdown(crossbeam_channel::Sender<()>),
}

/// Point-to-point work posted to the transport and not yet finished.
#[derive(Debug)]
struct InFlight {
    reqs: Vec<ReqId>,
    task: Task,
    deadline: Instant,
}

pub(crate) struct Executor {
    pub(crate) shared: Arc<Shared>,
    pub(crate) net: Box<dyn Transport>,
    pub(crate) waker: Arc<Waker>,
    pub(crate) staging: Staging,
    pub(crate) rx: Receiver<Command>,
    inflight: Vec<InFlight>,
}

impl Executor {
    pub(crate) fn new(
        shared: Arc<Shared>,
        net: Box<dyn Transport>,
        waker: Arc<Waker>,
        staging: Staging,
        rx: Receiver<Command>,
    ) -> Executor {
        Executor {
            shared,
            net,
            waker,
            staging,
            rx,
            inflight: Vec::new(),
        }
    }

    pub(crate) fn run(mut self) {
        loop {
            self.reap_inflight();
            let cmd = if self.inflight.is_empty() {
                match self.rx.recv() {
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
                Command::Run(task) => self.execute(task),
                Command::Shutdown(reply) => {
                    self.drain_inflight();
                    let _ = reply.send(());
                    break;
                }
            }
        }
        self.net.abort("communicator shut down");
    }

    /// Moves in-flight transfers while no new command is queued; wakes up for new commands.
    fn progress_idle(&mut self) {
        let until = self
            .inflight
            .iter()
            .map(|f| f.deadline)
            .min()
            .unwrap_or_else(Instant::now);
        self.waker.set_sleeping(true);
        if self.rx.is_empty() {
            // Transport failures surface per request, in `reap_inflight`.
            let _ = self.net.progress(until, true);
        }
        self.waker.set_sleeping(false);
    }

    fn ctx(&mut self, task_op: &'static str, seq: u64, timeout: Duration) -> OpCtx<'_> {
        OpCtx::new(
            self.shared.rank,
            self.shared.size,
            task_op,
            seq,
            timeout,
            self.net.as_mut(),
            &mut self.staging,
        )
    }

    fn execute(&mut self, task: Task) {
        if let Some(err) = self.shared.failure() {
            task.complete(Err(err));
            return;
        }
        task.request.start();
        let name = task.op.name();
        if task.op.is_p2p() {
            let posted = {
                let mut cx = self.ctx(name, task.seq, task.timeout);
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
        let result = {
            let mut cx = self.ctx(name, task.seq, task.timeout);
            algos::run_collective(&mut cx, &task.op)
        };
        match result {
            Ok(()) => task.complete(Ok(())),
            Err(e) => self.fail_task(task, e),
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
                            self.net.as_mut(),
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
                f.task.complete(Ok(()));
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

    fn fail_task(&mut self, task: Task, err: Error) {
        tracing::error!(comm = %self.shared.name, rank = self.shared.rank, "{err}");
        task.complete(Err(err.clone()));
        self.fail(err);
    }

    /// Marks the communicator failed, closes its connections (peers notice at once) and fails
    /// everything in flight.
    fn fail(&mut self, err: Error) {
        let wrapped = self.shared.set_failed(err.clone());
        self.net.abort(&err.to_string());
        if self.shared.abort_process_on_error {
            tracing::error!(
                comm = %self.shared.name,
                rank = self.shared.rank,
                "aborting the process (abort_process_on_timeout_or_error is set): {err}"
            );
            std::process::abort();
        }
        for f in self.inflight.drain(..) {
            f.task.complete(Err(wrapped.clone()));
        }
    }
}
