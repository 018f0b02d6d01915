//! Windows of the `ctran` backend. CPU tensors are registered with the engine's
//! [`ctran::window::Window`] (puts over shared memory or TCP, driven by the progress thread);
//! CUDA tensors with the NVLink transport's [`NvlWindow`] (stream-ordered puts, signals and
//! waits on the caller's stream), where every rank's GPU reaches every other's, and otherwise
//! with the engine's window staged through pinned memory ([`DeviceSink`]), its operations run
//! by the GPU progress engine in stream order over the host transports (a wait lands the bytes
//! its signal covers on the device).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use ctran::algos::select::Hints;
use ctran::comm::KeepAlive;
use ctran::cuda::{Context, RawStream};
use ctran::gpe::{cuda_err, DeviceLanding, Gpe, GpeRequest};
use ctran::nvl::window::NvlWindow;
use ctran::nvl::Nvl;
use ctran::window::staged::DeviceSink;
use ctran::window::Window as EngineWindow;
use ctran::{Comm, Op};
use torchcomms::{Device, Error, OpOptions, Result, Tensor, WindowBackend, Work};

use crate::work::{CtranWork, GpuWork};

/// A window over the engine's (CPU, or CUDA staged) or the NVLink transport's (CUDA).
#[derive(Debug)]
pub(crate) struct CtranWindow {
    host: EngineWindow,
    /// The NVLink transport while the engine lives (CUDA communicators where it is on).
    nvl: Option<Weak<Nvl>>,
    /// The GPU progress engine while the engine lives (CUDA communicators).
    gpe: Option<Weak<Gpe>>,
    device: Mutex<Option<NvlWindow>>,
    /// Set while a CUDA tensor is registered staged.
    staged: Mutex<Option<Staged>>,
    timeout: Duration,
}

/// A CUDA tensor registered staged.
#[derive(Debug, Default)]
struct Staged {
    /// The last operation issued on it, which deregistration waits for.
    last: Option<GpeRequest>,
}

impl CtranWindow {
    pub(crate) fn new(
        comm: Arc<Comm>,
        nvl: Option<Weak<Nvl>>,
        gpe: Option<Weak<Gpe>>,
    ) -> CtranWindow {
        let timeout = comm.config().timeout;
        CtranWindow {
            host: EngineWindow::new(comm),
            nvl,
            gpe,
            device: Mutex::new(None),
            staged: Mutex::new(None),
            timeout,
        }
    }

    fn staged(&self) -> MutexGuard<'_, Option<Staged>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn gpe(&self) -> Option<Arc<Gpe>> {
        self.gpe.as_ref().and_then(Weak::upgrade)
    }

    /// Registers a CUDA tensor staged (peers reach its GPU over host transports only).
    fn register_staged(&self, tensor: &Tensor, ordinal: u32) -> Result<()> {
        let rank = self.rank();
        let cuda = |e| Error::Engine(cuda_err("tensor_register", rank, e));
        let ctx = Context::get(ordinal).map_err(cuda)?;
        let size = self.host.comm().size();
        let sink = DeviceSink::new(&ctx, tensor.addr() as u64, tensor.nbytes(), size);
        let sink = Arc::new(sink.map_err(cuda)?);
        let mut keep: KeepAlive = tensor.owner().cloned().into_iter().collect();
        keep.push(sink.clone());
        self.host
            .register_staged(tensor.span(), sink, keep, Some(self.timeout))?;
        *self.staged() = Some(Staged::default());
        Ok(())
    }

    /// Runs a staged window's operation (built by `op`) through the GPU progress engine after
    /// the work on the caller's stream; `None` when no CUDA tensor is registered staged.
    fn on_staged(
        &self,
        opts: &OpOptions,
        keep: KeepAlive,
        op: impl FnOnce(&EngineWindow) -> ctran::Result<(Op, Option<DeviceLanding>)>,
    ) -> Option<Result<Work>> {
        let mut staged = self.staged();
        let staged = staged.as_mut()?;
        let run = || -> Result<Work> {
            let gpe = self.gpe().ok_or_else(|| {
                Error::Engine(ctran::Error::Finalized {
                    op: "window".into(),
                    comm: self.host.comm().name().into(),
                })
            })?;
            let (op, landing) = op(&self.host)?;
            let timeout = opts.timeout_or(self.timeout);
            let stream = RawStream(opts.stream.unwrap_or(0));
            let request =
                gpe.issue_landing(op, stream, timeout, Hints::default(), keep, landing)?;
            staged.last = Some(request.clone());
            let work = Work::new(
                Box::new(GpuWork {
                    request,
                    blocking: false,
                }),
                timeout,
            );
            if !opts.async_op {
                work.wait()?;
            }
            Ok(work)
        };
        Some(run())
    }

    fn rank(&self) -> usize {
        self.host.comm().rank()
    }

    fn host_work(&self, request: ctran::Request, opts: &OpOptions) -> Result<Work> {
        let timeout = opts.timeout_or(self.timeout);
        let rank = self.rank();
        let work = Work::new(Box::new(CtranWork { request, rank }), timeout);
        if !opts.async_op {
            work.wait()?;
        }
        Ok(work)
    }

    /// The device window, when the registered tensor is a CUDA one.
    fn device(&self) -> std::sync::MutexGuard<'_, Option<NvlWindow>> {
        self.device.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on the device window, if there is one; the work it returns is stream-ordered
    /// on the caller's stream (a synchronous call needs no more).
    fn on_device(
        &self,
        opts: &OpOptions,
        f: impl FnOnce(&NvlWindow, RawStream, Duration) -> ctran::Result<ctran::gpe::GpeRequest>,
    ) -> Option<Result<Work>> {
        let dev = self.device();
        let win = dev.as_ref()?;
        let timeout = opts.timeout_or(self.timeout);
        let stream = RawStream(opts.stream.unwrap_or(0));
        Some(
            f(win, stream, timeout)
                .map(|request| {
                    let handle = GpuWork {
                        request,
                        blocking: false,
                    };
                    Work::new(Box::new(handle), timeout)
                })
                .map_err(Error::from),
        )
    }
}

fn check_device(op: &str, t: &Tensor, cuda_window: bool) -> Result<()> {
    match (t.device(), cuda_window) {
        (Device::Cpu, false) | (Device::Cuda(_), true) => Ok(()),
        (d, true) => Err(Error::invalid(
            op,
            "tensor",
            "a CUDA tensor (the window is on the GPU)",
            d,
        )),
        (d, false) => Err(Error::invalid(
            op,
            "tensor",
            "a CPU tensor (the window is on the CPU)",
            d,
        )),
    }
}

impl WindowBackend for CtranWindow {
    fn register(&self, tensor: &Tensor) -> Result<()> {
        let Device::Cuda(ordinal) = tensor.device() else {
            let keep = tensor.owner().cloned().into_iter().collect();
            return Ok(self
                .host
                .register(tensor.span(), keep, Some(self.timeout))?);
        };
        let Some(nvl) = self.nvl.as_ref().and_then(Weak::upgrade) else {
            if self.gpe().is_none() {
                return Err(Error::invalid(
                    "tensor_register",
                    "tensor",
                    "a tensor on the communicator's device (a CPU communicator has no GPU)",
                    tensor.device(),
                ));
            }
            return self.register_staged(tensor, ordinal);
        };
        let win = nvl.new_window(tensor.addr() as u64, tensor.nbytes(), self.timeout)?;
        *self.device() = Some(win);
        Ok(())
    }

    fn deregister(&self) -> Result<()> {
        // A staged window's operations still queued on the GPU must reach the progress thread
        // before the collective fence, or they would find the region gone.
        if let Some(staged) = self.staged().take() {
            let pending = staged.last.map(|r| r.wait_blocking(self.timeout));
            let fenced = self.host.deregister(Some(self.timeout));
            pending.transpose()?;
            return Ok(fenced?);
        }
        // Dropping waits for this rank's puts; the barrier then means every rank's have ended
        // before any rank releases its memory.
        if let Some(win) = self.device().take() {
            drop(win);
            self.host.comm().run(Op::Barrier, Some(self.timeout))?;
            return Ok(());
        }
        Ok(self.host.deregister(Some(self.timeout))?)
    }

    fn put(&self, tensor: &Tensor, peer: usize, offset: usize, opts: &OpOptions) -> Result<Work> {
        let keep: ctran::comm::KeepAlive = tensor.owner().cloned().into_iter().collect();
        let cuda = self.device().is_some() || self.staged().is_some();
        check_device("put", tensor, cuda)?;
        if let Some(w) = self.on_staged(opts, keep.clone(), |win| {
            Ok((win.put_op(tensor.span(), peer, offset)?, None))
        }) {
            return w;
        }
        if let Some(w) = self.on_device(opts, |win, stream, timeout| {
            let (src, bytes) = (tensor.addr() as u64, tensor.nbytes());
            win.put(
                src,
                bytes,
                peer,
                offset,
                false,
                stream,
                keep.clone(),
                timeout,
            )
        }) {
            return w;
        }
        let timeout = opts.timeout_or(self.timeout);
        let r = self
            .host
            .put(tensor.span(), keep, peer, offset, Some(timeout));
        self.host_work(r, opts)
    }

    fn signal(&self, peer: usize, opts: &OpOptions) -> Result<Work> {
        if let Some(w) = self.on_staged(opts, Vec::new(), |win| Ok((win.signal_op(peer)?, None))) {
            return w;
        }
        if let Some(w) = self.on_device(opts, |win, stream, timeout| {
            win.signal(peer, stream, timeout)
        }) {
            return w;
        }
        let r = self.host.signal(peer, Some(opts.timeout_or(self.timeout)));
        self.host_work(r, opts)
    }

    fn wait_signal(&self, peer: usize, opts: &OpOptions) -> Result<Work> {
        if let Some(w) = self.on_staged(opts, Vec::new(), |win| win.wait_signal_op(peer)) {
            return w;
        }
        if let Some(w) = self.on_device(opts, |win, stream, timeout| {
            win.wait_signal(peer, stream, timeout)
        }) {
            return w;
        }
        let r = self
            .host
            .wait_signal(peer, Some(opts.timeout_or(self.timeout)));
        self.host_work(r, opts)
    }

    fn all_gather(&self, tensor: &Tensor, offset: usize, opts: &OpOptions) -> Option<Result<Work>> {
        let keep: ctran::comm::KeepAlive = tensor.owner().cloned().into_iter().collect();
        let work = self.on_device(opts, |win, stream, timeout| {
            let (src, bytes) = (tensor.addr() as u64, tensor.nbytes());
            win.all_gather(src, bytes, offset, stream, keep.clone(), timeout)
        })?;
        Some(work.and_then(|w| {
            if !opts.async_op {
                w.wait()?;
            }
            Ok(w)
        }))
    }

    fn supports(&self, tensor: &Tensor) -> bool {
        match tensor.device() {
            Device::Cuda(_) => {
                self.nvl.as_ref().and_then(Weak::upgrade).is_some() || self.gpe().is_some()
            }
            _ => true,
        }
    }

    fn mapped_addr(&self, rank: usize) -> Option<u64> {
        self.device().as_ref().and_then(|w| w.base(rank))
    }
}
