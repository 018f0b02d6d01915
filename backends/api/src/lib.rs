//! # torchcomms
//!
//! The TorchComm API of torchcomms-rs: [`TorchComm`] communicators created by [`new_comm`] on a
//! named backend (`ctran` is the project's own engine), [`Work`] handles, options, and the
//! [`Backend`] trait engines implement.
//!
//! ```no_run
//! use torchcomms::{new_comm, CommOptions, Device, OpOptions, ReduceOp, Tensor};
//! # fn main() -> torchcomms::Result<()> {
//! // Rank and size come from the launcher (torchrun, SLURM, MPI); the store from MASTER_ADDR.
//! let comm = new_comm("ctran", Device::Cpu, "world", CommOptions::from_env()?)?;
//! let t = Tensor::from_vec(vec![comm.get_rank() as f32; 4]);
//! comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?.wait()?;
//! comm.finalize()?;
//! # Ok(()) }
//! ```
//!
//! A backend crate must be linked for its name to resolve (`use torchcomms_ctran as _;`).

pub mod backend;
pub mod batch;
pub mod call;
pub mod check;
pub mod comm;
pub mod error;
pub mod moe;
mod ops;
pub mod options;
pub mod persistent;
pub mod reconfigure;
pub mod registry;
pub mod tensor;
pub mod window;
pub mod work;

pub use backend::{Backend, InitArgs};
pub use batch::BatchSendRecv;
pub use call::{Call, P2POp};
pub use comm::TorchComm;
pub use error::{Error, ErrorKind, Result};
pub use options::{CommOptions, Hints, OpOptions};
pub use persistent::AllGatherP;
pub use reconfigure::Reconfigurer;
pub use registry::{backend_names, is_backend_registered, register_backend, BackendRegistration};
pub use tensor::{Element, Tensor};
pub use torchcomms_core::bootstrap::Store;
pub use torchcomms_core::{DataType, Device, ReduceOp};
pub use window::{WinAccessType, Window, WindowAttr, WindowBackend};
pub use work::{OnComplete, Work, WorkHandle, WorkStatus};

/// Creates a communicator on `backend` for `device`, named `name`. A collective over all ranks:
/// rank and size come from `options` or the launcher's environment, the store from `options`
/// or `MASTER_ADDR`/`MASTER_PORT`.
pub fn new_comm(
    backend: &str,
    device: Device,
    name: &str,
    options: CommOptions,
) -> Result<TorchComm> {
    if name.is_empty() {
        return Err(Error::invalid(
            "new_comm",
            "name",
            "a non-empty communicator name",
            "\"\"",
        ));
    }
    let args = InitArgs {
        device,
        name: name.into(),
        options: options.clone(),
    };
    let b = registry::create_backend(backend, &args)?;
    Ok(TorchComm::new(b, backend, options))
}
