//! The engine's one entry point: a communicator with the device paths it started
//! ([`Engine`]), which runs every operation on the path the [selector](select) names.
//!
//! ```no_run
//! use std::sync::{Arc, Weak};
//! use ctran::engine::{Engine, Issue};
//! use ctran::{Comm, CommConfig, Device, Op};
//! # fn main() -> ctran::Result<()> {
//! # let store: Arc<dyn ctran::bootstrap::Store> = Arc::new(ctran::bootstrap::HashStore::new());
//! let comm = Arc::new(Comm::init(CommConfig::from_env("world", 0, 1)?, store)?);
//! let engine = Engine::start(comm, Device::Cpu, false)?;
//! let handle = engine.submit(Op::Barrier, Vec::new(), &Issue::default())?;
//! handle.wait_blocking(std::time::Duration::from_secs(10), 0)?;
//! engine.finalize()
//! # }
//! ```

pub mod select;

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::algos::select::Hints;
use crate::comm::{Comm, KeepAlive, Op, Request};
use crate::cuda::{Context, RawStream};
use crate::error::{Error, Result};
use crate::gpe::{Gpe, GpeConfig, GpeRequest};
use crate::mixed::Mixed;
use crate::nvl::Nvl;
use crate::types::Device;
use select::Path;

/// How a caller issues one operation.
#[derive(Debug, Clone, Copy, Default)]
pub struct Issue<'a> {
    /// Its deadline (`None`: the communicator's timeout).
    pub timeout: Option<Duration>,
    /// What the caller says about the algorithm choice.
    pub hints: Hints<'a>,
    /// Whether the caller waits for it later (for traces, and for device paths that run a
    /// synchronous kernel on the caller's stream itself).
    pub async_op: bool,
    /// The caller's CUDA stream (`CUstream` as an integer; 0 the legacy default stream) that
    /// the operation follows, for device buffers.
    pub stream: Option<u64>,
}

/// What running an operation returns: a host request, or a stream-ordered device request.
#[derive(Debug)]
pub enum Handle {
    /// Run on the communicator's progress thread.
    Host(Request),
    /// Run in stream order on a device path.
    Device(GpeRequest),
}

impl Handle {
    /// Blocks the host until the operation finished or `timeout` passed.
    pub fn wait_blocking(&self, timeout: Duration, rank: usize) -> Result<()> {
        match self {
            Handle::Host(r) => r.wait_timeout(timeout, rank),
            Handle::Device(r) => r.wait_blocking(timeout),
        }
    }
}

/// A communicator and the device paths it started: on a CUDA device the GPU progress engine,
/// plus NVLink where every rank's GPU reaches every other's, or the mixed NVLink+TCP plan where
/// the ranks sit on several hosts with NVLink inside each.
#[derive(Debug)]
pub struct Engine {
    comm: Arc<Comm>,
    device: Device,
    /// Declared before `gpe`, whose stream it launches on, so it is dropped first.
    nvl: Option<Arc<Nvl>>,
    /// Also before `gpe`.
    mixed: Option<Mixed>,
    gpe: Option<Arc<Gpe>>,
}

impl Engine {
    /// Starts the device paths of `comm` on `device` (none on the CPU). Every rank of the
    /// communicator calls it: NVLink and the mixed plan are agreed among the ranks.
    pub fn start(comm: Arc<Comm>, device: Device, high_priority_stream: bool) -> Result<Engine> {
        let mut engine = Engine {
            comm,
            device,
            nvl: None,
            mixed: None,
            gpe: None,
        };
        let Device::Cuda(ordinal) = device else {
            return Ok(engine);
        };
        let comm = &engine.comm;
        let ctx =
            Context::get(ordinal).map_err(|e| crate::gpe::cuda_err("new_comm", comm.rank(), e))?;
        let config = GpeConfig {
            chunk_bytes: comm.config().gpe_chunk_bytes,
            staging_budget: comm.config().gpe_staging_bytes,
            high_priority: high_priority_stream,
        };
        let gpe = Gpe::start(Arc::clone(comm), &ctx, config.clone())?;
        if comm.config().use_nvl {
            engine.nvl = Nvl::start(comm, &ctx, comm.config().nvl.clone())?.map(Arc::new);
            // Every rank knows whether NVLink covers the whole comm (the ranks agreed on it).
            if engine.nvl.is_none() {
                engine.mixed = Mixed::start(comm, &ctx, comm.config().nvl.clone(), config)?;
            }
        }
        engine.gpe = Some(Arc::new(gpe));
        Ok(engine)
    }

    /// The NVLink transport, where every rank's GPU reaches every other's.
    pub fn nvl(&self) -> Option<&Nvl> {
        self.nvl.as_deref()
    }

    /// The NVLink transport for objects that may outlive the engine (windows): they reach it
    /// while the engine lives.
    pub fn nvl_weak(&self) -> Option<Weak<Nvl>> {
        self.nvl.as_ref().map(Arc::downgrade)
    }

    /// The GPU progress engine (CUDA communicators) for objects that may outlive the engine
    /// (windows on GPU memory over host transports): they reach it while the engine lives.
    pub fn gpe_weak(&self) -> Option<Weak<Gpe>> {
        self.gpe.as_ref().map(Arc::downgrade)
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    /// The device the communicator serves.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Runs `op` on the path the selector names, holding `keep` (the owners of its buffers)
    /// until it finished.
    pub fn submit(&self, op: Op, keep: KeepAlive, issue: &Issue<'_>) -> Result<Handle> {
        let _turn = self.comm.claim_issuer(op.name())?;
        let Some(gpe) = &self.gpe else {
            let request = self.comm.submit_with_options(
                op,
                issue.timeout,
                keep,
                issue.hints,
                Some(issue.async_op),
            );
            return Ok(Handle::Host(request));
        };
        if self.comm.is_finalized() {
            return Err(Error::Finalized {
                op: op.name().into(),
                comm: self.comm.name().into(),
            });
        }
        let timeout = issue.timeout.unwrap_or(self.comm.config().timeout);
        let caller = RawStream(issue.stream.unwrap_or(0));
        for &path in select::device_paths(self.nvl.is_some(), self.mixed.is_some()) {
            let request = match (path, &self.nvl, &self.mixed) {
                (Path::Nvl | Path::Mixed, _, _) if !select::has_link_form(&op) => None,
                (Path::Nvl, Some(nvl), _) => {
                    let sync_op = !issue.async_op;
                    let stream = gpe.stream();
                    match nvl.issue(
                        &op,
                        caller,
                        stream,
                        timeout,
                        issue.hints,
                        keep.clone(),
                        sync_op,
                    ) {
                        Ok(r) => Some(r),
                        // Every rank met the same refusal in the address exchange (a buffer
                        // that cannot be exported): the next path carries this one.
                        Err(Error::NotSupported(why)) if !op.is_p2p() => {
                            tracing::debug!(op = op.name(), "nvl: {why}; on the next path");
                            None
                        }
                        Err(e) => return Err(e),
                    }
                }
                (Path::Mixed, _, Some(m)) => {
                    m.issue(&op, caller, gpe, timeout, issue.hints, &keep)?
                }
                (Path::Gpe, _, _) => {
                    return Ok(Handle::Device(gpe.issue(
                        op,
                        caller,
                        timeout,
                        issue.hints,
                        keep,
                    )?))
                }
                _ => None,
            };
            if let Some(r) = request {
                return Ok(Handle::Device(r));
            }
        }
        Err(Error::NotSupported(format!(
            "{} on {}: no device path took it",
            op.name(),
            self.device
        )))
    }

    /// Waits for outstanding work and releases the communicator and its device paths.
    pub fn finalize(&self) -> Result<()> {
        if let Some(gpe) = &self.gpe {
            gpe.stop();
        }
        if let Some(m) = &self.mixed {
            m.finalize()?;
        }
        self.comm.finalize()
    }

    /// Fails outstanding and future work on every path and drops connections.
    pub fn abort(&self, reason: &str) {
        if let Some(nvl) = &self.nvl {
            nvl.abort();
        }
        if let Some(m) = &self.mixed {
            m.abort(reason);
        }
        self.comm.abort(reason);
    }
}
