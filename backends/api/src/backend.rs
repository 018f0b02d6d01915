//! The seam between the API and an engine: [`Backend::run`] takes every operation as a [`Call`],
//! plus the management calls. [`TorchComm`](crate::TorchComm) validates every argument before
//! calling a backend, so backends may assume consistent sizes, ranks in range and matching
//! dtypes.

use std::fmt::Debug;

use torchcomms_core::Device;

use crate::call::Call;
use crate::error::{Error, Result};
use crate::options::{CommOptions, OpOptions};
use crate::work::Work;

/// What a backend gets to create a communicator.
#[derive(Debug, Clone)]
pub struct InitArgs {
    /// Device the communicator serves.
    pub device: Device,
    /// Communicator name.
    pub name: String,
    /// Options (store, timeout, hints, explicit rank/size).
    pub options: CommOptions,
}

/// An engine behind the TorchComm API.
pub trait Backend: Send + Sync + Debug {
    /// Backend name (`ctran`, `nccl`).
    fn backend_name(&self) -> &str;
    /// Version string of the engine or library behind the backend.
    fn version(&self) -> Result<String>;
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;
    /// Communicator name.
    fn comm_name(&self) -> &str;
    /// Device served.
    fn device(&self) -> Device;

    /// Runs one operation (its arguments checked by [`TorchComm`](crate::TorchComm)).
    fn run(&self, call: Call, opts: &OpOptions) -> Result<Work>;
    /// A sub-communicator of `ranks`; `None` on ranks that pass an empty list.
    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>>;
    /// Waits for outstanding work and releases resources.
    fn finalize(&self) -> Result<()>;
    /// Whether [`Backend::abort`] is implemented.
    fn supports_abort(&self) -> bool {
        false
    }
    /// Fails outstanding and future work and drops connections.
    fn abort(&self) -> Result<()> {
        Err(Error::NotImplemented {
            what: "abort".into(),
            comm: self.comm_name().into(),
        })
    }
    /// True once aborted.
    fn is_aborted(&self) -> bool {
        false
    }
    /// A new one-sided window of this communicator (no tensor registered yet).
    fn new_window(&self) -> Result<Box<dyn crate::window::WindowBackend>> {
        Err(Error::NotImplemented {
            what: format!("windows (new_window) in backend {}", self.backend_name()),
            comm: self.comm_name().into(),
        })
    }
    /// The device half of a CUDA MoE buffer of `cfg` on this communicator (every rank calls
    /// it, as a collective).
    fn new_moe(&self, cfg: &crate::moe::MoeConfig) -> Result<Box<dyn crate::moe::MoeDeviceEngine>> {
        let _ = cfg;
        Err(Error::NotImplemented {
            what: format!(
                "MoE dispatch and combine on CUDA in backend {}",
                self.backend_name()
            ),
            comm: self.comm_name().into(),
        })
    }
}
