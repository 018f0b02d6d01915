//! One NCCL communicator and what its operations share: the `ncclComm_t`, the device context,
//! the communicator's own stream, and its failure state. Owned through an `Arc` by the backend,
//! its work handles and its watchdog; the last owner destroys the NCCL communicator.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use torchcomms_core::bootstrap::Store;
use torchcomms_cuda::RawStream;

use crate::gpu::{Gpu, GpuError, GpuEvent, GpuStream};

use crate::error::NcclError;
use crate::sys::{self, ncclComm_t, ncclResult_t, Nccl};

/// Where ranks tell each other that a communicator was aborted.
#[derive(Debug, Clone)]
pub(crate) struct AbortChannel {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) key: String,
}

/// The state of one communicator shared by its backend, works and watchdog.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) nccl: &'static Nccl,
    /// The NCCL communicator; null once aborted or destroyed.
    raw: AtomicPtr<c_void>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) name: String,
    /// The device (CUDA for nccl, HIP for rccl).
    pub(crate) gpu: Gpu,
    /// The communicator's stream, where every operation runs.
    pub(crate) stream: GpuStream,
    /// Recorded on the caller's stream, waited on by ours, under `issue`.
    pre: GpuEvent,
    /// Serialises enqueues: an NCCL communicator takes calls from one thread at a time.
    issue: Mutex<()>,
    failed: AtomicBool,
    failure: Mutex<Option<NcclError>>,
    seq: AtomicU64,
    pub(crate) abort_channel: Option<AbortChannel>,
    /// Default timeout of operations.
    pub(crate) timeout: Duration,
    /// Exit the process when the communicator fails (`TORCHCOMM_ABORT_ON_ERROR`).
    pub(crate) abort_process: bool,
    pub(crate) high_priority: bool,
}

// SAFETY: the raw communicator is an AtomicPtr; NCCL calls on it are serialised by `issue`
// (ncclCommAbort, which NCCL allows from another thread, excepted); the other fields are Sync.
unsafe impl Send for Shared {}
// SAFETY: as for Send.
unsafe impl Sync for Shared {}

impl Shared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        nccl: &'static Nccl,
        raw: ncclComm_t,
        rank: usize,
        size: usize,
        name: String,
        gpu: Gpu,
        high_priority: bool,
        abort_channel: Option<AbortChannel>,
        timeout: Duration,
        abort_process: bool,
    ) -> Result<Shared, NcclError> {
        let gpu_err = |source| NcclError::Gpu {
            op: "creating the communicator's stream".into(),
            rank,
            comm: name.clone(),
            source: Box::new(source),
        };
        let stream = gpu.stream(high_priority).map_err(gpu_err)?;
        let pre = gpu.event().map_err(gpu_err)?;
        Ok(Shared {
            nccl,
            raw: AtomicPtr::new(raw),
            rank,
            size,
            name,
            gpu,
            stream,
            pre,
            issue: Mutex::new(()),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            seq: AtomicU64::new(0),
            abort_channel,
            timeout,
            abort_process,
            high_priority,
        })
    }

    /// The error that broke the communicator, if any.
    pub(crate) fn failure(&self) -> Option<NcclError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Takes the enqueue lock and returns the live communicator, or the error that broke it.
    pub(crate) fn begin(&self, op: &str) -> Result<(MutexGuard<'_, ()>, ncclComm_t), NcclError> {
        let g = self.issue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let raw = self.raw.load(Ordering::Acquire);
        if raw.is_null() {
            return Err(NcclError::Aborted {
                comm: self.name.clone(),
                rank: self.rank,
                reason: format!("{op} after the communicator was destroyed"),
            });
        }
        self.gpu.bind().map_err(|source| self.gpu_err(op, source))?;
        Ok((g, raw))
    }

    /// Orders the communicator's stream after the work issued so far on `caller`.
    pub(crate) fn follow(&self, op: &str, caller: RawStream) -> Result<(), NcclError> {
        self.pre
            .record(caller)
            .and_then(|()| self.pre.wait_on(self.stream.raw()))
            .map_err(|source| self.gpu_err(op, source))
    }

    /// The next sequence number.
    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// A failed call of the GPU runtime in `op`.
    pub(crate) fn gpu_err(&self, op: &str, source: impl Into<GpuError>) -> NcclError {
        NcclError::Gpu {
            op: op.into(),
            rank: self.rank,
            comm: self.name.clone(),
            source: Box::new(source.into()),
        }
    }

    /// Checks an NCCL result code.
    pub(crate) fn check(&self, call: &'static str, rc: ncclResult_t) -> Result<(), NcclError> {
        if rc == sys::NCCL_SUCCESS || rc == sys::NCCL_IN_PROGRESS {
            return Ok(());
        }
        Err(NcclError::Call {
            call,
            rank: self.rank,
            comm: self.name.clone(),
            message: self.nccl.describe(rc, self.raw.load(Ordering::Acquire)),
        })
    }

    /// Asks NCCL whether the communicator hit an asynchronous error.
    pub(crate) fn async_error(&self) -> Option<NcclError> {
        let raw = self.raw.load(Ordering::Acquire);
        if raw.is_null() {
            return None;
        }
        let mut rc = sys::NCCL_SUCCESS;
        // SAFETY: `raw` is a live communicator (only fail() nulls it, and it aborts after).
        let call = unsafe { (self.nccl.comm_get_async_error)(raw, &mut rc) };
        if call != sys::NCCL_SUCCESS {
            return None;
        }
        self.check("ncclCommGetAsyncError", rc).err()
    }

    /// Records `err` as the communicator's failure (the first one wins), aborts the NCCL
    /// communicator, and tells the other ranks through the store when `tell_peers`.
    pub(crate) fn fail(&self, err: NcclError, tell_peers: bool) {
        {
            let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
            if f.is_some() {
                return;
            }
            tracing::error!(comm = %self.name, rank = self.rank, "{err}");
            *f = Some(err.clone());
            self.failed.store(true, Ordering::Release);
        }
        if tell_peers {
            if let Some(ch) = &self.abort_channel {
                let msg = format!("rank {}: {err}", self.rank);
                if let Err(e) = ch.store.set(&ch.key, msg.as_bytes()) {
                    tracing::warn!(comm = %self.name, "cannot tell the other ranks: {e}");
                }
            }
        }
        self.abort_nccl();
        if self.abort_process {
            eprintln!(
                "torchcomms nccl: communicator `{}` failed on rank {}: {err}; exiting \
                 (TORCHCOMM_ABORT_ON_ERROR)",
                self.name, self.rank
            );
            std::process::abort();
        }
    }

    /// `ncclCommAbort`, once. Waits a little for an enqueue in progress, then aborts anyway:
    /// an enqueue blocked inside NCCL is exactly what abort must break.
    pub(crate) fn abort_nccl(&self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        let guard = loop {
            match self.issue.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        let raw = self.raw.swap(ptr::null_mut(), Ordering::AcqRel);
        if !raw.is_null() {
            if let Err(e) = self.gpu.bind() {
                tracing::warn!("{e}");
            }
            // SAFETY: `raw` was live and is now unreachable by others (swapped out).
            let rc = unsafe { (self.nccl.comm_abort)(raw) };
            if rc != sys::NCCL_SUCCESS {
                tracing::warn!(comm = %self.name, "ncclCommAbort returned {rc}");
            }
        }
        drop(guard);
    }

    /// Whether the NCCL communicator is gone (finalized or aborted).
    pub(crate) fn is_destroyed(&self) -> bool {
        self.raw.load(Ordering::Acquire).is_null()
    }

    /// Destroys the NCCL communicator after its work (`ncclCommFinalize` when present).
    pub(crate) fn destroy(&self) -> Result<(), NcclError> {
        let _g = self.issue.lock().unwrap_or_else(|p| p.into_inner());
        let raw = self.raw.swap(ptr::null_mut(), Ordering::AcqRel);
        if raw.is_null() {
            return Ok(());
        }
        self.gpu
            .bind()
            .map_err(|source| self.gpu_err("finalize", source))?;
        if let Some(fin) = self.nccl.comm_finalize {
            // SAFETY: `raw` is live and only we hold it now.
            let rc = unsafe { fin(raw) };
            self.check("ncclCommFinalize", rc)?;
        }
        // SAFETY: as above; destroyed once.
        let rc = unsafe { (self.nccl.comm_destroy)(raw) };
        self.check("ncclCommDestroy", rc)
    }

    /// Marks the communicator aborted by its owner.
    pub(crate) fn abort_by_user(&self) {
        self.fail(
            NcclError::Aborted {
                comm: self.name.clone(),
                rank: self.rank,
                reason: "abort() called".into(),
            },
            true,
        );
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let raw = self.raw.swap(ptr::null_mut(), Ordering::AcqRel);
        if raw.is_null() {
            return;
        }
        if let Err(e) = self.gpu.bind() {
            tracing::warn!("{e}");
            return;
        }
        // Work still queued on the stream finishes first (ncclCommDestroy waits for it).
        // SAFETY: the last owner; nobody else can reach `raw`.
        let rc = unsafe { (self.nccl.comm_destroy)(raw) };
        if rc != sys::NCCL_SUCCESS {
            tracing::warn!(comm = %self.name, "ncclCommDestroy returned {rc}");
        }
    }
}
