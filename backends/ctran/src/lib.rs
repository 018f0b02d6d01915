//! # torchcomms-ctran
//!
//! The `ctran` backend: the TorchComm API on the ctran engine. Linking this crate registers the
//! backend under the name `ctran` (`use torchcomms_ctran as _;`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use ctran::bootstrap::{env, rendezvous};
use ctran::engine::{Engine, Handle, Issue};
use ctran::moe::alltoallv::{DeviceAllToAllv, DynamicArgs};
use ctran::moe::AbortWord;
use ctran::{Comm, CommConfig, Op};
use torchcomms::{
    Backend, BackendRegistration, Call, CommOptions, Device, Error, InitArgs, OpOptions, Result,
    Work, WorkHandle,
};

mod lower;
mod moe;
mod window;
mod work;

use work::{CtranWork, GpuWork};

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
    /// The communicator and its device paths; the engine picks the path of each operation.
    engine: Engine,
    aborted: AtomicBool,
    /// CUDA `device_alltoallv_single` between ranks that map each other's memory (set up at
    /// the first one; `None` when they cannot).
    dynamic: OnceLock<Option<Arc<DeviceAllToAllv>>>,
    /// Polled by the MoE and device all_to_all_v kernels; raised by `abort()`.
    abort_word: OnceLock<Arc<AbortWord>>,
}

impl CtranBackend {
    fn new(engine: Engine) -> CtranBackend {
        CtranBackend {
            engine,
            aborted: AtomicBool::new(false),
            dynamic: OnceLock::new(),
            abort_word: OnceLock::new(),
        }
    }

    /// The word the device kernels poll for an abort (made at first use, on `ctx`'s device).
    fn abort_word(&self, ctx: &Arc<ctran::cuda::Context>) -> Result<Arc<AbortWord>> {
        if let Some(w) = self.abort_word.get() {
            return Ok(Arc::clone(w));
        }
        let rank = self.comm().rank();
        let w = AbortWord::new(ctx)
            .map_err(|e| Error::Engine(ctran::gpe::cuda_err("abort word", rank, e)))?;
        Ok(Arc::clone(self.abort_word.get_or_init(|| w)))
    }

    /// Runs a CUDA `device_alltoallv_single` with the kernels that keep the counts on the
    /// device; `None` where they cannot run (then the engine runs it). Every rank decides
    /// alike.
    fn run_dynamic(&self, call: &Call, opts: &OpOptions) -> Result<Option<Work>> {
        let Call::AllToAllDynamic {
            output,
            input,
            output_split_sizes,
            input_split_sizes,
        } = call
        else {
            return Ok(None);
        };
        let (Device::Cuda(ordinal), false) = (self.engine.device(), self.is_aborted()) else {
            return Ok(None);
        };
        let row_bytes = input.row_numel() * input.dtype().size_bytes();
        let rank = self.comm().rank();
        let cuda = |e| Error::Engine(ctran::gpe::cuda_err("device_alltoallv_single", rank, e));
        let op = match self.dynamic.get() {
            Some(op) => op.clone(),
            None => {
                let ctx = ctran::cuda::Context::get(ordinal).map_err(cuda)?;
                let abort = self.abort_word(&ctx)?;
                let op = DeviceAllToAllv::new(self.comm(), &ctx, abort)?.map(Arc::new);
                self.dynamic.get_or_init(|| op).clone()
            }
        };
        let Some(op) = op else {
            return Ok(None);
        };
        let args = DynamicArgs {
            input: input.addr() as u64,
            in_rows: input.rows(),
            output: output.addr() as u64,
            out_rows: output.rows(),
            row_bytes,
            in_counts: input_split_sizes.addr() as u64,
            out_counts: output_split_sizes.addr() as u64,
        };
        let stream = ctran::cuda::RawStream(opts.stream.unwrap_or(0));
        let captured = stream.is_capturing().map_err(cuda)?;
        // SAFETY: the tensors were checked by the API (device, sizes, counts of `size`
        // int64), and their owners keep them alive across the stream's work as with any
        // stream-ordered operation.
        if !unsafe { op.run(self.comm(), &args, stream) }? {
            return Ok(None);
        }
        let done = if captured {
            None
        } else {
            Some(op.event_after(stream).map_err(cuda)?)
        };
        let timeout = opts.timeout_or(self.comm().config().timeout);
        Ok(Some(Work::new(
            Box::new(work::KernelWork { done, op, stream }),
            timeout,
        )))
    }
    fn comm(&self) -> &Arc<Comm> {
        self.engine.comm()
    }

    /// Creates the communicator: rank and size from the options or the launcher's environment,
    /// the store from the options or `MASTER_ADDR`/`MASTER_PORT` (released after init).
    pub fn create(args: &InitArgs) -> Result<Box<dyn Backend>> {
        if let Device::Cuda(ordinal) = args.device {
            // Checked before the bootstrap, which every rank joins: fail alone and at once.
            let why = match ctran::cuda::unavailable_reason() {
                Some(why) => Some(why),
                None => ctran::cuda::driver().ok().and_then(|d| {
                    (ordinal >= d.device_count).then(|| {
                        format!(
                            "this process sees {} {} device(s)",
                            d.device_count,
                            d.platform.name()
                        )
                    })
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
        config.dedicated_store = o.dedicated_store;
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
        let engine = Engine::start(Arc::new(comm), args.device, o.high_priority_stream)?;
        Ok(Box::new(CtranBackend::new(engine)))
    }
}

impl Backend for CtranBackend {
    fn backend_name(&self) -> &str {
        "ctran"
    }
    fn new_window(&self) -> Result<Box<dyn torchcomms::WindowBackend>> {
        Ok(Box::new(window::CtranWindow::new(
            Arc::clone(self.comm()),
            self.engine.nvl_weak(),
            self.engine.gpe_weak(),
        )))
    }
    fn new_moe(
        &self,
        cfg: &torchcomms::moe::MoeConfig,
    ) -> Result<Box<dyn torchcomms::moe::MoeDeviceEngine>> {
        let Device::Cuda(ordinal) = self.engine.device() else {
            return Err(Error::invalid(
                "MoeBuffer",
                "comm",
                "a CUDA communicator",
                self.engine.device(),
            ));
        };
        let rank = self.comm().rank();
        let ctx = ctran::cuda::Context::get(ordinal)
            .map_err(|e| Error::Engine(ctran::gpe::cuda_err("MoeBuffer", rank, e)))?;
        let abort = self.abort_word(&ctx)?;
        Ok(Box::new(moe::CtranMoe::new(
            self.comm(),
            &ctx,
            ordinal,
            cfg,
            abort,
        )?))
    }
    fn version(&self) -> Result<String> {
        Ok(VERSION.into())
    }
    fn rank(&self) -> usize {
        self.comm().rank()
    }
    fn size(&self) -> usize {
        self.comm().size()
    }
    fn comm_name(&self) -> &str {
        self.comm().name()
    }
    fn device(&self) -> Device {
        self.engine.device()
    }

    fn run(&self, call: Call, opts: &OpOptions) -> Result<Work> {
        if let Some(work) = self.run_dynamic(&call, opts)? {
            return Ok(work);
        }
        let uniform_call = matches!(call, Call::AllToAll { uniform: true, .. });
        let (op, keep) = lower::lower(call, self.comm().name())?;
        let timeout = opts.timeout_or(self.comm().config().timeout);
        // Hints for the engine's algorithm choice (ctran::algos::select::Hints): `algo`, and
        // uniform blocks (all_to_all_single, or the `uniform_blocks` hint of a caller that
        // passes equal blocks on every rank).
        let hints = ctran::algos::select::Hints {
            algo: opts.hints.get("algo").map(String::as_str),
            uniform: uniform_call
                || opts
                    .hints
                    .get("uniform_blocks")
                    .is_some_and(|v| matches!(v.as_str(), "1" | "true")),
        };
        // A barrier on a CUDA device blocks the host, like ProcessGroupNCCL's.
        let blocking = matches!(op, Op::Barrier) && matches!(self.engine.device(), Device::Cuda(_));
        let issue = Issue {
            timeout: Some(timeout),
            hints,
            async_op: opts.async_op,
            stream: opts.stream,
        };
        let handle: Box<dyn WorkHandle> = match self.engine.submit(op, keep, &issue)? {
            Handle::Host(request) => Box::new(CtranWork {
                request,
                rank: self.comm().rank(),
            }),
            Handle::Device(request) => Box::new(GpuWork { request, blocking }),
        };
        let work = Work::new(handle, timeout);
        if !opts.async_op || blocking {
            work.wait()?;
        }
        Ok(work)
    }

    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>> {
        // The child runs with its own options (torchcomms: fresh defaults plus what was given).
        let child = self.comm().split(
            ranks,
            name,
            Some(options.timeout),
            options.abort_process_on_timeout_or_error,
        )?;
        let Some(comm) = child else {
            return Ok(None);
        };
        let device = self.engine.device();
        let engine = Engine::start(Arc::new(comm), device, options.high_priority_stream)?;
        Ok(Some(Box::new(CtranBackend::new(engine))))
    }

    fn finalize(&self) -> Result<()> {
        Ok(self.engine.finalize()?)
    }

    fn supports_abort(&self) -> bool {
        true
    }

    fn abort(&self) -> Result<()> {
        self.aborted.store(true, Ordering::Release);
        if let Some(w) = self.abort_word.get() {
            w.raise();
        }
        self.engine.abort("abort() called");
        Ok(())
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }
}
