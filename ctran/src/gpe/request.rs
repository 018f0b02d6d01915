//! What a work handle sees of an operation the GPU progress engine (or a kernel path that
//! reports the same way) runs: its device completion and its host half's outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::cuda::{Event, PinnedBuffer, RawStream};
use crate::error::{Error, Result};

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
    pub(super) fn cancel(&self, why: Error) {
        self.finish(Err(why));
        self.cancelled.store(true, Ordering::Release);
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub(super) fn finish(&self, r: Result<()>) {
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
    /// The stream does not wait for its host half (nothing comes back), so it is complete
    /// once the host half finished too.
    host_completes: bool,
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
            host_completes: false,
        }
    }

    /// This request's stream does not wait for its host half: it completes when the host
    /// half finished as well as the device's.
    pub(super) fn completed_by_host(mut self) -> GpeRequest {
        self.host_completes = true;
        self
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
        let device = self
            .done_event
            .query()
            .map_err(|e| cuda_err(self.op, self.rank, e))?;
        Ok(device && self.host_done())
    }

    /// Whether the host halves the device did not wait for (this stage's and earlier ones')
    /// have finished.
    fn host_done(&self) -> bool {
        (!self.host_completes || self.state.get().is_some())
            && self.before.iter().all(GpeRequest::host_done)
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
