//! # torchcomms-ctran
//!
//! The `ctran` backend: the TorchComm API on the ctran engine. Linking this crate registers the
//! backend under the name `ctran` (`use torchcomms_ctran as _;`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ctran::bootstrap::{env, rendezvous};
use ctran::gpe::{Gpe, GpeConfig, GpeRequest};
use ctran::mixed::Mixed;
use ctran::nvl::Nvl;
use ctran::{Comm, CommConfig, Op, P2p, Request, RequestStatus, Span};
use torchcomms::{
    Backend, BackendRegistration, Call, CommOptions, Device, Error, InitArgs, OpOptions, P2POp,
    Result, Tensor, Work, WorkHandle, WorkStatus,
};

inventory::submit! {
    BackendRegistration { name: "ctran", create: CtranBackend::create }
}

/// Names of the engine's transports in this build.
pub const TRANSPORTS: &[&str] = ctran::transport::AVAILABLE;

/// Version reported by `get_backend_version()`.
pub const VERSION: &str = concat!("ctran ", env!("CARGO_PKG_VERSION"));

/// A communicator of the ctran engine behind the TorchComm API.
#[derive(Debug)]
pub struct CtranBackend {
    comm: Arc<Comm>,
    device: Device,
    /// On a CUDA device whose peers all sit on this host and reach each other's GPUs: the
    /// NVLink transport (kernels on peer memory). Declared before `gpe`, whose stream it
    /// launches on, so it is dropped first.
    nvl: Option<Nvl>,
    /// On a CUDA device, when the ranks sit on several hosts with NVLink inside each: NVLink
    /// to the peers of this host, TCP to the others (all_reduce and p2p; the rest through
    /// `gpe`). Also before `gpe`.
    mixed: Option<Mixed>,
    /// On a CUDA device: the GPU progress engine that runs ops on device buffers through the
    /// host transports, stream-ordered.
    gpe: Option<Gpe>,
    aborted: AtomicBool,
}

/// Work handle over an engine request.
#[derive(Debug)]
struct CtranWork {
    request: Request,
    rank: usize,
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
}

/// Work handle of an op on device buffers: stream-ordered like ProcessGroupNCCL's.
#[derive(Debug)]
struct GpuWork {
    request: GpeRequest,
    blocking: bool,
}

impl WorkHandle for GpuWork {
    fn wait(&self, timeout: Duration) -> Result<()> {
        if self.blocking {
            return self.wait_blocking(timeout);
        }
        self.request.wait_on_stream().map_err(Error::Engine)
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

fn owners<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> ctran::comm::KeepAlive {
    tensors
        .into_iter()
        .filter_map(|t| t.owner().cloned())
        .collect()
}

fn spans(tensors: &[Tensor]) -> Vec<Span> {
    tensors.iter().map(Tensor::span).collect()
}

impl CtranBackend {
    /// Creates the communicator: rank and size from the options or the launcher's environment,
    /// the store from the options or `MASTER_ADDR`/`MASTER_PORT` (released after init).
    pub fn create(args: &InitArgs) -> Result<Box<dyn Backend>> {
        if let Device::Cuda(ordinal) = args.device {
            // Checked before the bootstrap, which every rank joins: fail alone and at once.
            let why = match ctran::cuda::unavailable_reason() {
                Some(why) => Some(why),
                None => ctran::cuda::driver().ok().and_then(|d| {
                    (ordinal >= d.device_count)
                        .then(|| format!("this process sees {} CUDA device(s)", d.device_count))
                }),
            };
            if let Some(why) = why {
                return Err(Error::Engine(ctran::Error::NotSupported(format!(
                    "device {}: {why}",
                    args.device
                ))));
            }
        }
        let o = &args.options;
        let (rank, size) = match (o.rank, o.size) {
            (Some(r), Some(s)) => (r, s),
            _ => {
                let info = env::discover()?.ok_or_else(|| {
                    Error::invalid(
                        "new_comm",
                        "rank/size",
                        "a launcher environment (TORCHCOMM_RANK/SIZE, RANK/WORLD_SIZE, OMPI_*, PMI_*, SLURM_*) or explicit rank and size",
                        "none found",
                    )
                })?;
                (o.rank.unwrap_or(info.rank), o.size.unwrap_or(info.size))
            }
        };
        let mut config = CommConfig::from_env(&args.name, rank, size)?;
        config.timeout = o.timeout;
        config.abort_process_on_error = o.abort_process_on_timeout_or_error;
        let comm = match &o.store {
            Some(store) => Comm::init(config, Arc::clone(store))?,
            None => {
                let boot = rendezvous::store_from_env(rank, size, o.timeout)?;
                let comm = Comm::init(config, Arc::clone(boot.store()))?;
                // Rank 0 stops serving MASTER_PORT here. The barrier keeps every rank from
                // starting its next communicator while the old server could still answer.
                drop(boot);
                comm.run(Op::Barrier, Some(o.timeout))?;
                comm
            }
        };
        let comm = Arc::new(comm);
        let (gpe, nvl, mixed) = start_gpu(&comm, args.device, o.high_priority_stream)?;
        Ok(Box::new(CtranBackend {
            comm,
            device: args.device,
            nvl,
            mixed,
            gpe,
            aborted: AtomicBool::new(false),
        }))
    }

    fn issue(&self, op: Op, keep: ctran::comm::KeepAlive, opts: &OpOptions) -> Result<Work> {
        let timeout = opts.timeout_or(self.comm.config().timeout);
        // Hints for the engine's algorithm choice (ctran::algos::select::Hints): `algo`, and
        // `uniform_blocks` (every rank passes equal blocks, as all_to_all_single does).
        let hints = ctran::algos::select::Hints {
            algo: opts.hints.get("algo").map(String::as_str),
            uniform: opts
                .hints
                .get("uniform_blocks")
                .is_some_and(|v| matches!(v.as_str(), "1" | "true")),
        };
        if let Some(gpe) = &self.gpe {
            // A barrier blocks the host, like ProcessGroupNCCL's.
            let blocking = matches!(op, Op::Barrier);
            let caller = ctran::cuda::RawStream(opts.stream.unwrap_or(0));
            if self.comm.is_finalized() {
                return Err(Error::Engine(ctran::Error::Finalized {
                    op: op.name().into(),
                    comm: self.comm.name().into(),
                }));
            }
            // NVLink (or the mixed paths) where they take the op; the GPE otherwise.
            let fast = match (&self.nvl, &self.mixed) {
                (Some(nvl), _) => {
                    let sync_op = !opts.async_op;
                    match nvl.issue(
                        &op,
                        caller,
                        gpe.stream(),
                        timeout,
                        hints,
                        keep.clone(),
                        sync_op,
                    ) {
                        Ok(r) => Some(r),
                        // Every rank met the same refusal in the address exchange (a buffer
                        // that cannot be exported): the host transports carry this one.
                        Err(ctran::Error::NotSupported(why)) if !op.is_p2p() => {
                            tracing::debug!(op = op.name(), "nvl: {why}; through the GPE");
                            None
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                (None, Some(m)) => m.issue(&op, caller, gpe, timeout, hints, &keep)?,
                (None, None) => None,
            };
            let request = match fast {
                Some(r) => r,
                None => gpe.issue(op, caller, timeout, hints, keep)?,
            };
            let work = Work::new(Box::new(GpuWork { request, blocking }), timeout);
            if !opts.async_op || blocking {
                work.wait()?;
            }
            return Ok(work);
        }
        let request =
            self.comm
                .submit_with_options(op, Some(timeout), keep, hints, Some(opts.async_op));
        let work = Work::new(
            Box::new(CtranWork {
                request,
                rank: self.comm.rank(),
            }),
            timeout,
        );
        if !opts.async_op {
            work.wait()?;
        }
        Ok(work)
    }
}

/// The engines of a communicator on a CUDA device (none on CPU): the GPU progress engine,
/// and where every rank's GPU reaches every other's, the NVLink transport; or where the ranks
/// sit on several hosts with NVLink inside each, the mixed NVLink+TCP paths.
type GpuEngines = (Option<Gpe>, Option<Nvl>, Option<Mixed>);

fn start_gpu(comm: &Arc<Comm>, device: Device, high_priority: bool) -> Result<GpuEngines> {
    let Device::Cuda(ordinal) = device else {
        return Ok((None, None, None));
    };
    let ctx = ctran::cuda::Context::get(ordinal).map_err(|e| {
        Error::Engine(ctran::Error::Cuda {
            op: "new_comm".into(),
            rank: comm.rank(),
            detail: e.to_string(),
        })
    })?;
    let config = GpeConfig {
        chunk_bytes: comm.config().gpe_chunk_bytes,
        staging_budget: comm.config().gpe_staging_bytes,
        high_priority,
    };
    let gpe = Gpe::start(Arc::clone(comm), &ctx, config.clone())?;
    if !comm.config().use_nvl {
        return Ok((Some(gpe), None, None));
    }
    let nvl = Nvl::start(comm, &ctx, comm.config().nvl.clone())?;
    // Every rank knows whether NVLink covers the whole comm (the ranks agreed on it).
    let mixed = match nvl {
        Some(_) => None,
        None => Mixed::start(comm, &ctx, comm.config().nvl.clone(), config)?,
    };
    Ok((Some(gpe), nvl, mixed))
}

impl Backend for CtranBackend {
    fn backend_name(&self) -> &str {
        "ctran"
    }
    fn version(&self) -> Result<String> {
        Ok(VERSION.into())
    }
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn comm_name(&self) -> &str {
        self.comm.name()
    }
    fn device(&self) -> Device {
        self.device
    }

    fn run(&self, call: Call, opts: &OpOptions) -> Result<Work> {
        let keep = owners(call.tensors());
        let op = match call {
            Call::AllReduce { tensor, op } => Op::AllReduce {
                buf: tensor.span(),
                dtype: tensor.dtype(),
                op,
            },
            Call::Reduce { tensor, root, op } => Op::Reduce {
                buf: tensor.span(),
                dtype: tensor.dtype(),
                op,
                root,
            },
            Call::Broadcast { tensor, root } => Op::Broadcast {
                buf: tensor.span(),
                root,
            },
            Call::AllGather { outputs, input } => Op::AllGather {
                input: input.span(),
                outputs: spans(&outputs),
            },
            Call::ReduceScatter { output, inputs, op } => Op::ReduceScatter {
                inputs: spans(&inputs),
                output: output.span(),
                dtype: output.dtype(),
                op,
            },
            Call::AllToAll { outputs, inputs } => Op::AllToAll {
                inputs: spans(&inputs),
                outputs: spans(&outputs),
            },
            Call::Scatter {
                output,
                inputs,
                root,
            } => Op::Scatter {
                inputs: spans(&inputs),
                output: output.span(),
                root,
            },
            Call::Gather {
                outputs,
                input,
                root,
            } => Op::Gather {
                input: input.span(),
                outputs: spans(&outputs),
                root,
            },
            Call::Barrier => Op::Barrier,
            Call::Send { tensor, peer } => Op::Send {
                buf: tensor.span(),
                peer,
            },
            Call::Recv { tensor, peer } => Op::Recv {
                buf: tensor.span(),
                peer,
            },
            Call::Batch { ops } => Op::Batch {
                ops: ops
                    .iter()
                    .map(|o| match o {
                        P2POp::Send { tensor, peer } => P2p::Send {
                            buf: tensor.span(),
                            peer: *peer,
                        },
                        P2POp::Recv { tensor, peer } => P2p::Recv {
                            buf: tensor.span(),
                            peer: *peer,
                        },
                    })
                    .collect(),
            },
            other => {
                return Err(Error::NotImplemented {
                    what: format!("{other:?}"),
                    comm: self.comm.name().into(),
                })
            }
        };
        self.issue(op, keep, opts)
    }

    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>> {
        // The child runs with its own options (torchcomms: fresh defaults plus what was given).
        let child = self.comm.split(
            ranks,
            name,
            Some(options.timeout),
            options.abort_process_on_timeout_or_error,
        )?;
        let Some(comm) = child else {
            return Ok(None);
        };
        let comm = Arc::new(comm);
        let (gpe, nvl, mixed) = start_gpu(&comm, self.device, options.high_priority_stream)?;
        Ok(Some(Box::new(CtranBackend {
            comm,
            device: self.device,
            nvl,
            mixed,
            gpe,
            aborted: AtomicBool::new(false),
        })))
    }

    fn finalize(&self) -> Result<()> {
        if let Some(gpe) = &self.gpe {
            gpe.stop();
        }
        if let Some(m) = &self.mixed {
            m.finalize()?;
        }
        Ok(self.comm.finalize()?)
    }

    fn supports_abort(&self) -> bool {
        true
    }

    fn abort(&self) -> Result<()> {
        self.aborted.store(true, Ordering::Release);
        if let Some(nvl) = &self.nvl {
            nvl.abort();
        }
        if let Some(m) = &self.mixed {
            m.abort("abort() called");
        }
        self.comm.abort("abort() called");
        Ok(())
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}
