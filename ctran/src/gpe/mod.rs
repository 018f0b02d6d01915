//! The GPU progress engine: collectives on device buffers over host transports (sockets, shared
//! memory), stream-ordered like NCCL's and without blocking the caller's host thread.
//!
//! An operation is issued in two halves that meet through two counters in mapped host memory:
//!
//! - **On the comm's stream** (after the caller's current stream): for each step of the
//!   [`plan`], copy the inputs to pinned staging and `post` the step number; then, for each
//!   step, `wait` until the host reports it done and copy the outputs back; record an event.
//!   An operation with nothing to copy back on this rank (a send) does not wait: the stream
//!   moves on once its inputs are staged, as NCCL's sends do once the data left the buffer, so
//!   ranks that all send before they receive (both ways around a ring) do not deadlock; its
//!   work completes when its host half has.
//! - **On the GPE thread**: when a step is posted, submit its host operation (over staging) to
//!   the ctran communicator, which runs every algorithm and transport of the CPU path; when it
//!   completes, raise `done` to its number.
//!
//! Steps are numbered in issue order and `done` rises in that order (the communicator runs
//! operations in order), so two counters serve every operation in flight; it passes over the
//! steps no stream waits for (staged sends) while they are still in flight. A failed or timed-out
//! step still raises `done`, so the stream never hangs on a dead peer: the error reaches the
//! work handle, and the outputs are left unspecified, as with NCCL after an abort.
//!
//! The GPE thread makes no CUDA call while it drives operations: it reads and writes only the
//! mapped counters. A `cuMemFree` elsewhere in the process waits for the device, the device
//! waits for the GPE thread, and a driver call on that thread could wait for the `cuMemFree`.
//! For the same reason it never drops the last reference to a tensor: a reaper thread does.
//!
//! Not capturable in CUDA graphs: the host half is driven per issue, and a replay would find
//! its steps already done. An op issued while the caller's stream captures is refused.

mod direct;
pub mod kernels;
pub(crate) mod plan;
mod request;
mod staging;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use crate::algos::select::Hints;
use crate::comm::{Comm, KeepAlive};
use crate::cuda::{self, Context, Event, PinnedBuffer, RawStream, Stream};
use crate::error::{Error, Result};
use crate::Op;
pub use kernels::DeviceLanding;
use kernels::GpeKernels;
pub use request::{cuda_err, DeviceStatus, GpeRequest, OpState};

use plan::Plan;
use staging::{Staging, StagingPool};

/// Offsets of the counters in the flag buffer (on separate cache lines): the last step whose
/// inputs are staged, the last step the host completed, and the last step whose outputs the
/// device has copied back (after which its staging and buffers may go).
const POSTED: usize = 0;
const DONE: usize = 64;
const FINISHED: usize = 128;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct GpeConfig {
    /// Bytes per pipelined step of the single-buffer collectives.
    pub chunk_bytes: usize,
    /// Pinned staging ring per communicator (operations larger get their own buffer).
    pub staging_budget: usize,
    /// Use a high-priority stream.
    pub high_priority: bool,
}

/// The GPU progress engine of one communicator on one device.
#[derive(Debug)]
pub struct Gpe {
    shared: Arc<Shared>,
    tx: Sender<Job>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Shared {
    comm: Arc<Comm>,
    ctx: Arc<Context>,
    kernels: Arc<GpeKernels>,
    stream: Stream,
    /// Orders the comm's stream after the caller's.
    pre: Event,
    flags: PinnedBuffer,
    pool: StagingPool,
    /// Sends and receives moved in place over ib (GPUDirect RDMA).
    direct: direct::Direct,
    config: GpeConfig,
    /// Serialises issue: step numbers, stream order and the job queue must agree.
    issue: Mutex<u64>,
    /// Set once the thread stops: later issues fail.
    stopped: AtomicU64,
    /// Where the GPE thread sends the buffers of finished operations to be dropped: dropping
    /// the last reference to device memory calls `cuMemFree`, which waits for the device, and
    /// the device may be waiting for the GPE thread.
    reaper: Sender<KeepAlive>,
}

/// What the device half of one operation waits for.
struct Job {
    op: &'static str,
    /// (step number, host operation), in order.
    steps: Vec<(u64, Op)>,
    hints_algo: Option<String>,
    uniform: bool,
    issued: Instant,
    timeout: Duration,
    state: Arc<OpState>,
    staging: Option<Staging>,
    keep: KeepAlive,
    /// Whether the stream waits for its steps (it has outputs to copy back, or the NIC moves
    /// its buffers in place); a staged send's stream does not.
    stream_waits: bool,
}

impl Job {
    /// The number of its last step (a plan has at least one).
    fn last_step(&self) -> u64 {
        self.steps.last().map_or(0, |(n, _)| *n)
    }

    /// Keeps its buffers forever, for a job the device may still be using: leaking is safe,
    /// freeing memory in use is not.
    fn leak_buffers(&mut self) {
        std::mem::forget(std::mem::take(&mut self.keep));
        std::mem::forget(self.staging.take());
    }
}

impl Gpe {
    /// Starts the engine of `comm` on device `ctx`.
    pub fn start(comm: Arc<Comm>, ctx: &Arc<Context>, config: GpeConfig) -> Result<Gpe> {
        let rank = comm.rank();
        let e = |err| cuda_err("GPE start", rank, err);
        let kernels = GpeKernels::get(ctx).map_err(e)?;
        let stream = Stream::new(ctx, config.high_priority).map_err(e)?;
        let pre = Event::new(ctx).map_err(e)?;
        let flags = PinnedBuffer::alloc(ctx, 256).map_err(e)?;
        let (reaper, reaper_rx) = crossbeam_channel::unbounded::<KeepAlive>();
        let shared = Arc::new(Shared {
            reaper,
            pool: StagingPool::new(ctx, config.staging_budget, &comm),
            direct: direct::Direct::new(&comm),
            comm,
            ctx: Arc::clone(ctx),
            kernels,
            stream,
            pre,
            flags,
            config,
            issue: Mutex::new(0),
            stopped: AtomicU64::new(0),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("ctran-gpe-reaper-{rank}"))
            .spawn(move || {
                // Ends when the engine is dropped (the sender with it).
                for keep in reaper_rx {
                    drop(keep);
                }
            })
            .map_err(|err| Error::NotSupported(format!("starting the GPE reaper ({err})")))?;
        let thread = std::thread::Builder::new()
            .name(format!("ctran-gpe-{rank}"))
            .spawn(move || run(&s, &rx))
            .map_err(|err| Error::NotSupported(format!("starting the GPE thread ({err})")))?;
        Ok(Gpe {
            shared,
            tx,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The comm's stream.
    pub fn stream(&self) -> RawStream {
        self.shared.stream.as_raw()
    }

    /// Issues `op` (over device buffers of this engine's device) after the work on `caller`.
    pub fn issue(
        &self,
        op: Op,
        caller: RawStream,
        timeout: Duration,
        hints: Hints<'_>,
        keep: KeepAlive,
    ) -> Result<GpeRequest> {
        self.issue_landing(op, caller, timeout, hints, keep, None)
    }

    /// [`Gpe::issue`], with a landing copy on the device once the host part is done.
    pub fn issue_landing(
        &self,
        op: Op,
        caller: RawStream,
        timeout: Duration,
        hints: Hints<'_>,
        keep: KeepAlive,
        landing: Option<DeviceLanding>,
    ) -> Result<GpeRequest> {
        let s = &self.shared;
        let name = op.name();
        let rank = s.comm.rank();
        let e = |err| cuda_err(name, rank, err);
        if s.stopped.load(Ordering::Acquire) != 0 {
            return Err(Error::Finalized {
                op: name.into(),
                comm: s.comm.name().into(),
            });
        }
        if let Some(f) = s.comm.failure() {
            return Err(f);
        }
        if caller.is_capturing().map_err(e)? {
            return Err(Error::NotSupported(format!(
                "{name}: capturing ctran GPU operations over host transports (socket, shm) in a \
                 CUDA graph; issue it outside the capture, or use the nccl backend"
            )));
        }
        // Check the choice now, so a bad hint fails at the call rather than on the GPE thread.
        s.comm.algo_for(&op, hints)?;
        s.ctx.bind().map_err(e)?;
        // Moved by the NIC between the tensors themselves: one step over the device buffers,
        // nothing to copy, and the stream waits until the NIC is done with them.
        let in_place = landing.is_none() && s.direct.prepare(&op, &s.comm, &s.ctx);
        let (staging, Plan { steps }) = if in_place {
            (None, plan::in_place(op))
        } else {
            // Earlier operations still hold the ring: wait for them (bounded by the timeout).
            let staging = s
                .pool
                .take(plan::staging_bytes(&op, rank), Instant::now() + timeout)
                .map_err(e)?
                .ok_or_else(|| Error::Timeout {
                    op: name.into(),
                    seq: 0,
                    rank,
                    peer: None,
                    timeout,
                })?;
            let plan = plan::plan(
                &op,
                rank,
                staging.as_ptr(),
                s.config.chunk_bytes,
                hints.uniform,
            );
            (Some(staging), plan)
        };
        let done_event = Arc::new(Event::new(&s.ctx).map_err(e)?);
        let base = staging.as_ref().map_or(0, |b| b.as_ptr() as u64);
        tracing::trace!(rank, op = name, steps = steps.len(), "GPE: issue");
        let mut next = s.issue.lock().unwrap_or_else(|p| p.into_inner());
        let first = *next + 1;
        // The numbers are taken even if a launch below fails: the counters only rise.
        *next += steps.len() as u64;
        let mut copies = Vec::with_capacity(steps.len());
        let mut host_steps = Vec::with_capacity(steps.len());
        for (i, st) in steps.into_iter().enumerate() {
            copies.push((st.inputs, st.outputs));
            host_steps.push((first + i as u64, st.host));
        }
        // An operation that writes nothing back on this rank (a send, a reduce's non-root)
        // releases the stream once its inputs are staged, as NCCL's sends leave once the data
        // is in the peer's buffer: later operations on the stream (the matching receive of a
        // both-ways exchange) are posted without waiting for the peer to take it.
        let stream_waits =
            in_place || landing.is_some() || copies.iter().any(|(_, out)| !out.is_empty());
        let state = Arc::new(OpState::default());
        // The host half goes to the GPE thread before the device half is enqueued. Once the
        // stream holds a wait kernel, another thread's `cuMemFree` (which waits for the device)
        // can block this thread's next driver call until that wait is released, and only the
        // GPE thread can release it: it must already have the job.
        let job = Job {
            op: name,
            steps: host_steps,
            hints_algo: hints.algo.map(str::to_string),
            uniform: hints.uniform,
            issued: Instant::now(),
            timeout,
            state: Arc::clone(&state),
            staging,
            keep,
            stream_waits,
        };
        if self.tx.send(job).is_err() {
            // The thread is gone: nothing was enqueued, so nothing waits for it.
            return Err(Error::Aborted {
                comm: s.comm.name().into(),
                reason: format!("{name}: the GPU progress engine of rank {rank} has stopped"),
            });
        }
        if let Err(err) = s.enqueue(
            caller,
            first,
            &copies,
            base,
            landing,
            stream_waits,
            &done_event,
        ) {
            // Part of the device half may be enqueued and the peers expect this rank: the
            // communicator cannot go on. The GPE thread releases what was enqueued.
            let err = e(err);
            state.cancel(err.clone());
            s.comm.abort(&format!(
                "GPE: enqueueing {name} on the comm stream failed: {err}"
            ));
            return Err(err);
        }
        drop(next);
        let request = GpeRequest::new(name, done_event, state, caller, rank, false);
        Ok(if stream_waits {
            request
        } else {
            request.completed_by_host()
        })
    }

    /// Stops the thread after the operations in flight (their device halves are released even
    /// if their host halves cannot finish), then waits for the comm's stream.
    pub fn stop(&self) {
        let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        self.shared.stopped.store(1, Ordering::Release);
        if t.join().is_err() {
            tracing::error!("the GPE thread panicked");
        }
        if let Err(e) = self.shared.stream.as_raw().synchronize() {
            tracing::warn!("GPE stop: synchronising the comm stream: {e}");
        }
        self.shared.direct.release(&self.shared.comm);
    }

    /// How many sends, receives and batches of them moved in place over ib so far.
    pub fn direct_ops(&self) -> u64 {
        self.shared.direct.ran()
    }
}

impl Drop for Gpe {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    /// The device half of an operation whose steps are numbered from `first`, on the comm's
    /// stream after the caller's: per step, copy its inputs to staging and post it; then per
    /// step, wait for the host and copy its outputs back (unless `stream_waits` is false:
    /// nothing comes back); then run the landing copy, if any, mark it finished and record
    /// `done_event`.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        caller: RawStream,
        first: u64,
        copies: &[(Vec<plan::Copy>, Vec<plan::Copy>)],
        base: u64,
        landing: Option<DeviceLanding>,
        stream_waits: bool,
        done_event: &Event,
    ) -> std::result::Result<(), cuda::CudaError> {
        let stream = self.stream.as_raw();
        let posted = self.flags.device_ptr() + POSTED as u64;
        let done = self.flags.device_ptr() + DONE as u64;
        let finished = self.flags.device_ptr() + FINISHED as u64;
        self.pre.record(caller)?;
        stream.wait_event(&self.pre)?;
        for (i, (inputs, _)) in copies.iter().enumerate() {
            for c in inputs {
                // SAFETY: the device range belongs to a tensor kept alive by the job's `keep`
                // until the device has run the copies back; the staging range lies within the
                // job's staging, kept as long.
                unsafe { cuda::copy_any_async(base + c.staging as u64, c.device, c.len, stream) }?;
            }
            // SAFETY: the flag buffer lives as long as the engine, which outlives its stream's
            // work (Drop synchronises the stream).
            unsafe { self.kernels.post(posted, first + i as u64, stream) }?;
        }
        for (i, (_, outputs)) in copies.iter().enumerate().filter(|_| stream_waits) {
            // SAFETY: as for post; the GPE thread raises `done` for every step it is given,
            // failed and cancelled ones included.
            unsafe { self.kernels.wait(done, first + i as u64, stream) }?;
            for c in outputs {
                // SAFETY: as for the copies in.
                unsafe { cuda::copy_any_async(c.device, base + c.staging as u64, c.len, stream) }?;
            }
        }
        if let Some(l) = landing {
            // SAFETY: the host filled the list before it raised `done` for the last step,
            // which the wait above passed; the caller of issue_landing vouches that the list,
            // staging and window stay allocated and hold the listed ranges.
            unsafe { self.kernels.land(l.list, l.staging, l.window, stream) }?;
        }
        let last = first + copies.len() as u64 - 1;
        // SAFETY: as for post.
        unsafe { self.kernels.post(finished, last, stream) }?;
        done_event.record(stream)
    }

    fn counter(&self, offset: usize) -> &AtomicU64 {
        // SAFETY: the flag buffer is 256 bytes of pinned memory, 8-byte aligned at these
        // offsets, alive as long as self; the device accesses it only with whole-word volatile
        // loads and stores.
        unsafe { &*(self.flags.as_ptr().add(offset).cast::<AtomicU64>()) }
    }

    fn posted(&self) -> u64 {
        self.counter(POSTED).load(Ordering::Acquire)
    }

    fn raise_done(&self, step: u64) {
        self.counter(DONE).fetch_max(step, Ordering::Release);
    }
}

/// A step submitted to the communicator.
struct Submitted {
    step: u64,
    req: crate::Request,
    /// The outcome of its job.
    state: Arc<OpState>,
    /// Whether the stream waits for it (see [`Job::stream_waits`]).
    stream_waits: bool,
}

/// Takes the completed steps out of `inflight` (in step order) and says how far `done` may
/// rise: past every step before the first one that is neither completed nor passable (`state`
/// gives (step number, completed, the stream waits for it)).
fn settle<T>(
    inflight: &mut VecDeque<T>,
    state: impl Fn(&T) -> (u64, bool, bool),
) -> (Vec<T>, Option<u64>) {
    let (mut retired, mut done) = (Vec::new(), None);
    let mut i = 0;
    while let Some(f) = inflight.get(i) {
        let (step, completed, stream_waits) = state(f);
        if !completed && stream_waits {
            break;
        }
        done = Some(step);
        if completed {
            retired.extend(inflight.remove(i));
        } else {
            i += 1;
        }
    }
    (retired, done)
}

/// A job on the GPE thread: its next step to submit and its requests in flight.
struct Running {
    job: Job,
    next: usize,
}

fn run(s: &Shared, rx: &Receiver<Job>) {
    if let Err(e) = s.ctx.bind() {
        tracing::error!("GPE: {e}");
    }
    if let Err(e) = cuda::relax_capture_mode_for_this_thread() {
        tracing::warn!("GPE: cannot relax the stream capture mode: {e}");
    }
    let rank = s.comm.rank();
    // Jobs whose steps are not all submitted yet, in issue order.
    let mut waiting: VecDeque<Running> = VecDeque::new();
    // Submitted steps: (step number, request, the outcome of its job).
    let mut inflight: VecDeque<Submitted> = VecDeque::new();
    // Jobs whose host half is over, kept until their device copies have run.
    let mut draining: Vec<Job> = Vec::new();
    let mut idle_rounds = 0u32;
    loop {
        let mut progressed = false;
        // New jobs.
        loop {
            match rx.try_recv() {
                Ok(job) => {
                    waiting.push_back(Running { job, next: 0 });
                    progressed = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        let stopping = s.stopped.load(Ordering::Acquire) != 0;
        // Submit posted steps, in order.
        while let Some(front) = waiting.front_mut() {
            let Some((step, host)) = front.job.steps.get(front.next) else {
                let r = waiting.pop_front().expect("front exists");
                draining.push(r.job);
                continue;
            };
            let step = *step;
            if s.posted() >= step {
                let hints = Hints {
                    algo: front.job.hints_algo.as_deref(),
                    uniform: front.job.uniform,
                };
                let left = front
                    .job
                    .timeout
                    .saturating_sub(front.job.issued.elapsed())
                    .max(Duration::from_millis(1));
                let req = s.comm.submit_with_options(
                    host.clone(),
                    Some(left),
                    Vec::new(),
                    hints,
                    Some(true),
                );
                tracing::trace!(rank, step, op = front.job.op, "GPE: step posted, submitted");
                inflight.push_back(Submitted {
                    step,
                    req,
                    state: Arc::clone(&front.job.state),
                    stream_waits: front.job.stream_waits,
                });
                front.next += 1;
                progressed = true;
                continue;
            }
            // Not posted yet: the caller's stream is still busy before this op, or its device
            // half was never enqueued whole (cancelled), so its steps will never be posted.
            let cancelled = front.job.state.is_cancelled();
            if !cancelled && front.job.issued.elapsed() <= front.job.timeout {
                break;
            }
            if !cancelled {
                let why = Error::Timeout {
                    op: front.job.op.into(),
                    seq: step,
                    rank,
                    peer: None,
                    timeout: front.job.timeout,
                };
                front.job.state.finish(Err(why.clone()));
                s.comm.abort(&format!(
                    "GPE: the GPU did not reach {} within its timeout",
                    front.job.op
                ));
            }
            // Release every step of it at once (any wait that was enqueued); the stream passes
            // through with garbage.
            s.raise_done(front.job.last_step());
            let r = waiting.pop_front().expect("front exists");
            draining.push(r.job);
            progressed = true;
        }
        // Complete steps. `done` rises in step order, passing over steps the device never
        // waits for (a staged send's): a receive issued after a send that waits for its
        // receiver completes on the device without it (both ways around a ring, every rank
        // sends first).
        let (retired, done) = settle(&mut inflight, |f| {
            (f.step, f.req.is_completed(), f.stream_waits)
        });
        for f in &retired {
            if let Some(e) = f.req.error() {
                tracing::debug!(rank, step = f.step, "GPE: step failed: {e}");
                f.state.finish(Err(e));
            }
            tracing::trace!(rank, step = f.step, "GPE: step done");
        }
        progressed |= !retired.is_empty();
        if let Some(step) = done {
            s.raise_done(step);
        }
        // Finish jobs whose steps all completed; release their buffers once the device is
        // past their copies back.
        draining.retain_mut(|job| {
            let last = job.last_step();
            let host_over = s.counter(DONE).load(Ordering::Acquire) >= last
                && !inflight.iter().any(|f| f.step <= last);
            if !host_over {
                return true;
            }
            job.state.finish(Ok(()));
            if job.state.is_cancelled() {
                // Its copies back may or may not have been enqueued, and it may never be
                // marked finished.
                job.leak_buffers();
                progressed = true;
                return false;
            }
            if s.counter(FINISHED).load(Ordering::Acquire) < last {
                return true;
            }
            if let Some(b) = job.staging.take() {
                s.pool.give(b);
            }
            tracing::trace!(rank, op = job.op, "GPE: operation released");
            // Never drop tensors here (see `Shared::reaper`).
            let _ = s.reaper.send(std::mem::take(&mut job.keep));
            progressed = true;
            false
        });
        if stopping && waiting.is_empty() && inflight.is_empty() {
            // Release any device wait that could still come (ops refused after the flag).
            s.raise_done(u64::MAX);
            // Operations whose copies back have not run yet (the device never got there):
            // wait a while, then leak their buffers rather than free memory in use.
            let give_up = Instant::now() + Duration::from_secs(10);
            for mut job in draining.drain(..) {
                let last = job.last_step();
                while s.counter(FINISHED).load(Ordering::Acquire) < last && Instant::now() < give_up
                {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if s.counter(FINISHED).load(Ordering::Acquire) >= last {
                    let _ = s.reaper.send(std::mem::take(&mut job.keep));
                } else {
                    tracing::warn!(rank, op = job.op, "GPE stop: the device never finished it");
                    job.leak_buffers();
                }
            }
            return;
        }
        if progressed {
            idle_rounds = 0;
            continue;
        }
        idle_rounds += 1;
        if waiting.is_empty() && inflight.is_empty() && draining.is_empty() {
            // Nothing in flight: block on the queue (bounded, to notice a stop).
            if let Ok(job) = rx.recv_timeout(Duration::from_millis(50)) {
                waiting.push_back(Running { job, next: 0 });
            }
        } else if idle_rounds < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(if idle_rounds < 1024 {
                10
            } else {
                100
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(steps: &[(u64, bool, bool)]) -> (Vec<u64>, Option<u64>, Vec<u64>) {
        let mut q: VecDeque<(u64, bool, bool)> = steps.iter().copied().collect();
        let (retired, done) = settle(&mut q, |&t| t);
        let left = q.iter().map(|s| s.0).collect();
        (retired.iter().map(|s| s.0).collect(), done, left)
    }

    #[test]
    fn done_passes_over_steps_the_device_does_not_wait_for() {
        // (step, completed, device waits)
        // Two staged sends in flight, then a completed receive: done reaches the receive.
        assert_eq!(
            run(&[
                (1, false, false),
                (2, false, false),
                (3, true, true),
                (4, false, true)
            ]),
            (vec![3], Some(3), vec![1, 2, 4])
        );
        // An incomplete step the device waits for stops it; later completions wait.
        assert_eq!(
            run(&[(1, true, true), (2, false, true), (3, true, true)]),
            (vec![1], Some(1), vec![2, 3])
        );
        assert_eq!(run(&[(5, false, true)]), (vec![], None, vec![5]));
        // Everything completed.
        assert_eq!(
            run(&[(1, true, false), (2, true, true)]),
            (vec![1, 2], Some(2), vec![])
        );
    }
}
