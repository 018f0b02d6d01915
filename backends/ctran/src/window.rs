//! Windows of the `ctran` backend. CPU tensors are registered with the engine's
//! [`ctran::window::Window`] (puts over shared memory or TCP, driven by the progress thread);
//! CUDA tensors with the NVLink transport's [`NvlWindow`] (stream-ordered puts, signals and
//! waits on the caller's stream), where every rank's GPU reaches every other's.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ctran::cuda::RawStream;
use ctran::nvl::window::NvlWindow;
use ctran::nvl::Nvl;
use ctran::window::Window as EngineWindow;
use ctran::{Comm, Op};
use torchcomms::{Device, Error, OpOptions, Result, Tensor, WindowBackend, Work};

use crate::work::{CtranWork, GpuWork};

/// A window over the engine's (CPU) or the NVLink transport's (CUDA).
#[derive(Debug)]
pub(crate) struct CtranWindow {
    host: EngineWindow,
    /// The NVLink transport while the engine lives (CUDA communicators where it is on).
    nvl: Option<Weak<Nvl>>,
    device: Mutex<Option<NvlWindow>>,
    timeout: Duration,
}

impl CtranWindow {
    pub(crate) fn new(comm: Arc<Comm>, nvl: Option<Weak<Nvl>>) -> CtranWindow {
        let timeout = comm.config().timeout;
        CtranWindow {
            host: EngineWindow::new(comm),
            nvl,
            device: Mutex::new(None),
            timeout,
        }
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
        let Device::Cuda(_) = tensor.device() else {
            let keep = tensor.owner().cloned().into_iter().collect();
            return Ok(self
                .host
                .register(tensor.span(), keep, Some(self.timeout))?);
        };
        let nvl = self.nvl.as_ref().and_then(Weak::upgrade).ok_or_else(|| {
            Error::invalid(
                "tensor_register",
                "tensor",
                "a CPU tensor, or a CUDA tensor on a communicator whose GPUs all reach each \
                 other over NVLink (CUDA windows run on the NVLink transport)",
                tensor.device(),
            )
        })?;
        let win = nvl.new_window(tensor.addr() as u64, tensor.nbytes(), self.timeout)?;
        *self.device() = Some(win);
        Ok(())
    }

    fn deregister(&self) -> Result<()> {
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
        let cuda = self.device().is_some();
        check_device("put", tensor, cuda)?;
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
        if let Some(w) = self.on_device(opts, |win, stream, timeout| {
            win.signal(peer, stream, timeout)
        }) {
            return w;
        }
        let r = self.host.signal(peer, Some(opts.timeout_or(self.timeout)));
        self.host_work(r, opts)
    }

    fn wait_signal(&self, peer: usize, opts: &OpOptions) -> Result<Work> {
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
            Device::Cuda(_) => self.nvl.as_ref().and_then(Weak::upgrade).is_some(),
            _ => true,
        }
    }

    fn mapped_addr(&self, rank: usize) -> Option<u64> {
        self.device().as_ref().and_then(|w| w.base(rank))
    }
}
