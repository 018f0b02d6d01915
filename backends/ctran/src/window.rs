//! Windows of the `ctran` backend: CPU tensors registered with the engine's
//! [`ctran::window::Window`]; CUDA tensors are refused (not supported yet).

use std::sync::Arc;
use std::time::Duration;

use ctran::window::Window as EngineWindow;
use ctran::Comm;
use torchcomms::{Device, Error, OpOptions, Result, Tensor, WindowBackend, Work};

use crate::work::CtranWork;

/// A window over the engine's.
#[derive(Debug)]
pub(crate) struct CtranWindow {
    win: EngineWindow,
    timeout: Duration,
}

impl CtranWindow {
    pub(crate) fn new(comm: Arc<Comm>) -> CtranWindow {
        let timeout = comm.config().timeout;
        CtranWindow {
            win: EngineWindow::new(comm),
            timeout,
        }
    }

    fn work(&self, request: ctran::Request, opts: &OpOptions) -> Result<Work> {
        let timeout = opts.timeout_or(self.timeout);
        let rank = self.win.comm().rank();
        let work = Work::new(Box::new(CtranWork { request, rank }), timeout);
        if !opts.async_op {
            work.wait()?;
        }
        Ok(work)
    }
}

fn cpu_only(op: &str, t: &Tensor) -> Result<()> {
    match t.device() {
        Device::Cpu => Ok(()),
        d => Err(Error::invalid(
            op,
            "tensor",
            "a CPU tensor (CUDA windows are not supported yet by the ctran backend)",
            d,
        )),
    }
}

impl WindowBackend for CtranWindow {
    fn register(&self, tensor: &Tensor) -> Result<()> {
        cpu_only("tensor_register", tensor)?;
        let keep = tensor.owner().cloned().into_iter().collect();
        Ok(self.win.register(tensor.span(), keep, Some(self.timeout))?)
    }

    fn deregister(&self) -> Result<()> {
        Ok(self.win.deregister(Some(self.timeout))?)
    }

    fn put(&self, tensor: &Tensor, peer: usize, offset: usize, opts: &OpOptions) -> Result<Work> {
        cpu_only("put", tensor)?;
        let keep = tensor.owner().cloned().into_iter().collect();
        let timeout = opts.timeout_or(self.timeout);
        let r = self
            .win
            .put(tensor.span(), keep, peer, offset, Some(timeout));
        self.work(r, opts)
    }

    fn signal(&self, peer: usize, opts: &OpOptions) -> Result<Work> {
        let r = self.win.signal(peer, Some(opts.timeout_or(self.timeout)));
        self.work(r, opts)
    }

    fn wait_signal(&self, peer: usize, opts: &OpOptions) -> Result<Work> {
        let r = self
            .win
            .wait_signal(peer, Some(opts.timeout_or(self.timeout)));
        self.work(r, opts)
    }
}
