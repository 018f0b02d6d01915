//! Work handles over the engine's requests: a host request, waited on by blocking; a device
//! request, stream-ordered like ProcessGroupNCCL's works.

use std::time::Duration;

use ctran::cuda::RawStream;
use ctran::gpe::GpeRequest;
use ctran::{Request, RequestStatus};
use torchcomms::{Error, OnComplete, Result, WorkHandle, WorkStatus};

/// Work handle over a host request.
#[derive(Debug)]
pub(crate) struct CtranWork {
    pub(crate) request: Request,
    pub(crate) rank: usize,
}

impl WorkHandle for CtranWork {
    fn wait(&self, timeout: Duration) -> Result<()> {
        self.request
            .wait_timeout(timeout, self.rank)
            .map_err(|e| match e {
                ctran::Error::Timeout { op, peer: None, .. } => Error::WaitTimeout {
                    op,
                    rank: self.rank,
                    timeout,
                },
                e => Error::Engine(e),
            })
    }

    fn status(&self) -> WorkStatus {
        match self.request.status() {
            RequestStatus::Queued => WorkStatus::NotStarted,
            RequestStatus::Started => WorkStatus::InProgress,
            RequestStatus::Completed => WorkStatus::Completed,
            RequestStatus::Failed => match self.request.error() {
                Some(e) if e.is_timeout() => WorkStatus::TimedOut,
                _ => WorkStatus::Error,
            },
        }
    }

    fn error(&self) -> Option<Error> {
        self.request.error().map(Error::Engine)
    }

    fn on_complete(&self, f: OnComplete) -> std::result::Result<(), OnComplete> {
        self.request.on_finish(f);
        Ok(())
    }
}

/// Work handle of an op on device buffers: stream-ordered like ProcessGroupNCCL's.
#[derive(Debug)]
pub(crate) struct GpuWork {
    pub(crate) request: GpeRequest,
    /// `wait()` blocks the host (a barrier, as ProcessGroupNCCL's does).
    pub(crate) blocking: bool,
}

impl WorkHandle for GpuWork {
    fn wait(&self, timeout: Duration) -> Result<()> {
        if self.blocking {
            return self.wait_blocking(timeout);
        }
        self.request.wait_on_stream().map_err(Error::Engine)
    }

    fn wait_on_stream(&self, stream: u64, timeout: Duration) -> Result<()> {
        if self.blocking {
            return self.wait_blocking(timeout);
        }
        self.request
            .wait_on(RawStream(stream))
            .map_err(Error::Engine)
    }

    fn wait_blocking(&self, timeout: Duration) -> Result<()> {
        self.request.wait_blocking(timeout).map_err(Error::Engine)
    }

    fn status(&self) -> WorkStatus {
        match (self.request.is_completed(), self.request.error()) {
            (_, Some(e)) if e.is_timeout() => WorkStatus::TimedOut,
            (_, Some(_)) => WorkStatus::Error,
            (true, None) => WorkStatus::Completed,
            (false, None) => WorkStatus::InProgress,
        }
    }

    fn error(&self) -> Option<Error> {
        self.request.error().map(Error::Engine)
    }
}

/// Work handle of kernels issued on the caller's stream (the device all_to_all_v): already
/// ordered on that stream; errors the kernels report are read once they have run.
#[derive(Debug)]
pub(crate) struct KernelWork {
    /// Recorded after the kernels; `None` when they were captured in a CUDA graph (they run at
    /// each replay, which the graph's owner waits for: nothing to poll).
    pub(crate) done: Option<ctran::cuda::Event>,
    pub(crate) op: std::sync::Arc<ctran::moe::alltoallv::DeviceAllToAllv>,
    pub(crate) stream: RawStream,
}

impl KernelWork {
    fn finished(&self) -> Result<bool> {
        let Some(done) = &self.done else {
            return Ok(true);
        };
        done.query()
            .map_err(|e| Error::Engine(ctran::gpe::cuda_err("device_alltoallv_single", 0, e)))
    }
}

impl WorkHandle for KernelWork {
    fn wait(&self, _timeout: Duration) -> Result<()> {
        Ok(())
    }

    fn wait_on_stream(&self, stream: u64, _timeout: Duration) -> Result<()> {
        let Some(done) = &self.done else {
            return Ok(());
        };
        if RawStream(stream) == self.stream {
            return Ok(());
        }
        RawStream(stream)
            .wait_event(done)
            .map_err(|e| Error::Engine(ctran::gpe::cuda_err("wait", 0, e)))
    }

    fn wait_blocking(&self, _timeout: Duration) -> Result<()> {
        let Some(done) = &self.done else {
            return Ok(());
        };
        done.synchronize()
            .map_err(|e| Error::Engine(ctran::gpe::cuda_err("wait", 0, e)))?;
        self.op
            .take_error()
            .map_or(Ok(()), |e| Err(Error::Engine(e)))
    }

    fn status(&self) -> WorkStatus {
        match self.finished() {
            Ok(true) => WorkStatus::Completed,
            Ok(false) => WorkStatus::InProgress,
            Err(_) => WorkStatus::Error,
        }
    }

    fn error(&self) -> Option<Error> {
        match self.finished() {
            Ok(true) => self.op.take_error().map(Error::Engine),
            Ok(false) => None,
            Err(e) => Some(e),
        }
    }
}
