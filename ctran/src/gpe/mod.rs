//! The GPU progress engine: collectives on device buffers over host transports (sockets, shared
//! memory), stream-ordered like NCCL's and without blocking the caller's host thread.
//!
//! An operation is issued in two halves that meet through two counters in mapped host memory:
//!
//! - **On the comm's stream** (after the caller's current stream): for each step of the
//!   [`plan`], copy the inputs to pinned staging and `post` the step number; then, for each
//!   step, `wait` until the host reports it done and copy the outputs back; record an event.
//! - **On the GPE thread**: when a step is posted, submit its host operation (over staging) to
//!   the ctran communicator, which runs every algorithm and transport of the CPU path; when it
//!   completes, raise `done` to its number.
//!
//! Steps are numbered in issue order and complete in that order (the communicator runs
//! operations in order), so two counters serve every operation in flight. A failed or timed-out
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

pub mod kernels;
pub(crate) mod plan;
mod staging;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// The host half's outcome, shared with the work handle.
#[derive(Debug, Default)]
pub struct OpState {
    result: Mutex<Option<Result<()>>>,
    /// Where kernels that wait on peers report giving up (the NVLink path).
    device: Option<DeviceStatus>,
    /// Its device half could not be enqueued (see [`Gpe::issue`]).
    cancelled: AtomicBool,
}

/// A status word in mapped host memory that a comm's kernels set when they time out or see the
/// abort flag; sticky, like NCCL's asynchronous error.
#[derive(Debug, Clone)]
pub struct DeviceStatus {
    /// The word (and what keeps it allocated).
    pub word: Arc<PinnedBuffer>,
    /// The communicator's name.
    pub comm: String,
    /// The operation's timeout.
    pub timeout: Duration,
}

impl DeviceStatus {
    /// The error the word reports for `op` on `rank`, if any.
    pub fn error(&self, op: &str, rank: usize) -> Option<Error> {
        // SAFETY: the word is 4 aligned bytes of mapped memory that kernels write atomically.
        let v = unsafe { std::ptr::read_volatile(self.word.as_ptr().cast::<u32>()) };
        match v {
            0 => None,
            crate::nvl::kernels::STATUS_TIMEOUT => Some(Error::Timeout {
                op: op.into(),
                seq: 0,
                rank,
                peer: None,
                timeout: self.timeout,
            }),
            _ => Some(Error::Aborted {
                comm: self.comm.clone(),
                reason: format!("{op}: the communicator was aborted while its kernels waited"),
            }),
        }
    }
}

impl OpState {
    /// The outcome of an operation whose kernels report through `device`.
    pub(crate) fn on_device(device: DeviceStatus) -> OpState {
        OpState {
            result: Mutex::new(None),
            device: Some(device),
            cancelled: AtomicBool::new(false),
        }
    }

    /// Fails an operation whose device half could not be enqueued.
    fn cancel(&self, why: Error) {
        self.finish(Err(why));
        self.cancelled.store(true, Ordering::Release);
    }

    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn finish(&self, r: Result<()>) {
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() || matches!(g.as_ref(), Some(Ok(()))) && r.is_err() {
            *g = Some(r);
        }
    }

    fn get(&self) -> Option<Result<()>> {
        self.result
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn get_for(&self, op: &str, rank: usize) -> Option<Result<()>> {
        if let Some(e) = self.device.as_ref().and_then(|d| d.error(op, rank)) {
            return Some(Err(e));
        }
        self.get()
    }
}

/// One issued operation, as the work handle sees it.
#[derive(Debug, Clone)]
pub struct GpeRequest {
    op: &'static str,
    done_event: Arc<Event>,
    state: Arc<OpState>,
    caller: RawStream,
    rank: usize,
    /// Issued while the caller's stream captured a CUDA graph: it runs at each replay, which
    /// the graph's owner waits for, so the handle has nothing to poll.
    captured: bool,
    /// Earlier stages of the same operation (enqueued before this one, so done when it is),
    /// whose errors this handle reports too.
    before: Vec<GpeRequest>,
    /// It ran on the caller's stream itself, which therefore needs no wait for it.
    on_caller: bool,
}

impl GpeRequest {
    /// A request completed by `done_event` on the device, its outcome in `state`.
    pub(crate) fn new(
        op: &'static str,
        done_event: Arc<Event>,
        state: Arc<OpState>,
        caller: RawStream,
        rank: usize,
        captured: bool,
    ) -> GpeRequest {
        GpeRequest {
            op,
            done_event,
            state,
            caller,
            rank,
            captured,
            before: Vec::new(),
            on_caller: false,
        }
    }

    /// This request's work was enqueued on the caller's stream itself (see
    /// [`crate::nvl::Nvl::issue`]): waiting on it orders nothing more.
    pub fn on_caller_stream(mut self) -> GpeRequest {
        self.on_caller = true;
        self
    }

    /// This request as the last stage of an operation issued after the work on `caller`,
    /// whose `earlier` stages ran before it on the device: waiting on it orders `caller` after
    /// the whole operation (not after the stream this stage was ordered behind), and it reports
    /// the earlier stages' errors as well as its own.
    pub fn finishing(mut self, caller: RawStream, earlier: Vec<GpeRequest>) -> GpeRequest {
        self.on_caller &= self.caller == caller;
        self.caller = caller;
        self.before.extend(earlier);
        self
    }

    /// The first error of the operation's stages, if any has failed.
    fn failure(&self) -> Option<Error> {
        self.before
            .iter()
            .find_map(GpeRequest::failure)
            .or_else(|| match self.state.get_for(self.op, self.rank) {
                Some(Err(e)) => Some(e),
                _ => None,
            })
    }

    /// Makes the caller's stream wait for the operation (returns at once). An error the host
    /// half already met is returned.
    pub fn wait_on_stream(&self) -> Result<()> {
        self.wait_on(self.caller)
    }

    /// Makes `stream` wait for the operation (returns at once). An error the host half already
    /// met is returned.
    pub fn wait_on(&self, stream: RawStream) -> Result<()> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        if self.on_caller && stream == self.caller {
            return Ok(());
        }
        stream
            .wait_event(&self.done_event)
            .map_err(|e| cuda_err(self.op, self.rank, e))
    }

    /// Blocks the host until the operation's device work is done, or `timeout` passes.
    pub fn wait_blocking(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut nap = Duration::from_micros(20);
        if self.captured {
            return Ok(());
        }
        loop {
            if let Some(e) = self.failure() {
                return Err(e);
            }
            if self.is_done()? {
                return self.failure().map_or(Ok(()), Err);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: self.op.into(),
                    seq: 0,
                    rank: self.rank,
                    peer: None,
                    timeout,
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    fn is_done(&self) -> Result<bool> {
        self.done_event
            .query()
            .map_err(|e| cuda_err(self.op, self.rank, e))
    }

    /// True once the device work is done (successfully or not).
    pub fn is_completed(&self) -> bool {
        self.captured || self.is_done().unwrap_or(true)
    }

    /// The error of a failed operation.
    pub fn error(&self) -> Option<Error> {
        if self.captured {
            return None;
        }
        self.failure()
    }
}

/// A driver error of `op` on `rank` as an engine error.
pub fn cuda_err(op: &str, rank: usize, e: crate::cuda::CudaError) -> Error {
    Error::Cuda {
        op: op.into(),
        rank,
        detail: e.to_string(),
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
            pool: StagingPool::new(ctx, config.staging_budget),
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
        let Plan { steps } = plan::plan(
            &op,
            rank,
            staging.as_ptr(),
            s.config.chunk_bytes,
            hints.uniform,
        );
        let done_event = Arc::new(Event::new(&s.ctx).map_err(e)?);
        let base = staging.as_ptr() as u64;
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
            staging: Some(staging),
            keep,
        };
        if self.tx.send(job).is_err() {
            // The thread is gone: nothing was enqueued, so nothing waits for it.
            return Err(Error::Aborted {
                comm: s.comm.name().into(),
                reason: format!("{name}: the GPU progress engine of rank {rank} has stopped"),
            });
        }
        if let Err(err) = s.enqueue(caller, first, &copies, base, landing, &done_event) {
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
        Ok(GpeRequest::new(
            name, done_event, state, caller, rank, false,
        ))
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
    /// step, wait for the host and copy its outputs back; then run the landing copy, if any,
    /// mark it finished and record `done_event`.
    fn enqueue(
        &self,
        caller: RawStream,
        first: u64,
        copies: &[(Vec<plan::Copy>, Vec<plan::Copy>)],
        base: u64,
        landing: Option<DeviceLanding>,
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
        for (i, (_, outputs)) in copies.iter().enumerate() {
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
    let mut inflight: VecDeque<(u64, crate::Request, Arc<OpState>)> = VecDeque::new();
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
                inflight.push_back((step, req, Arc::clone(&front.job.state)));
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
        // Complete steps, in order.
        while let Some((step, req, state)) = inflight.front() {
            if !req.is_completed() {
                break;
            }
            if let Some(e) = req.error() {
                tracing::debug!(rank, step, "GPE: step failed: {e}");
                state.finish(Err(e));
            }
            tracing::trace!(rank, step, "GPE: step done");
            s.raise_done(*step);
            inflight.pop_front();
            progressed = true;
        }
        // Finish jobs whose steps all completed; release their buffers once the device is
        // past their copies back.
        draining.retain_mut(|job| {
            let last = job.last_step();
            let host_over = s.counter(DONE).load(Ordering::Acquire) >= last
                && !inflight.iter().any(|(n, _, _)| *n <= last);
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
