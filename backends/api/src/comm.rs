//! `TorchComm`: the communicator users hold. Its operations (`ops.rs`, one per row of the table)
//! check every argument, naming the argument and what was expected, then hand the call to the
//! backend; this file holds the rest: accessors, batches, split, finalize and abort.

use std::sync::atomic::{AtomicBool, Ordering};

use torchcomms_core::Device;

use crate::backend::Backend;
use crate::call::{Call, P2POp};
use crate::check::Check;
use crate::error::{Error, Result};
use crate::options::{CommOptions, OpOptions};
use crate::tensor::Tensor;
use crate::work::Work;

/// A communicator: a group of ranks that run collectives together.
#[derive(Debug)]
pub struct TorchComm {
    pub(crate) backend: Box<dyn Backend>,
    backend_name: String,
    options: CommOptions,
    finalized: AtomicBool,
}

impl TorchComm {
    /// Wraps a backend (see [`crate::new_comm`]).
    pub fn new(backend: Box<dyn Backend>, backend_name: &str, options: CommOptions) -> TorchComm {
        TorchComm {
            backend,
            backend_name: backend_name.into(),
            options,
            finalized: AtomicBool::new(false),
        }
    }

    /// The checks of operation `op`; fails on a finalized communicator.
    pub(crate) fn check(&self, op: &'static str) -> Result<Check<'_>> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::Finalized {
                op: op.into(),
                comm: self.get_name().into(),
            });
        }
        Ok(Check::new(op, self))
    }

    /// Hands a checked call to the backend, with the communicator's timeout unless the call
    /// has its own.
    pub(crate) fn run(&self, call: Call, o: &OpOptions) -> Result<Work> {
        let opts = OpOptions {
            timeout: Some(o.timeout_or(self.options.timeout)),
            ..o.clone()
        };
        match call {
            Call::AllGatherP { handle, input } => self.run_persistent(&handle, &input, &opts),
            call => self.backend.run(call, &opts),
        }
    }

    /// This rank.
    pub fn get_rank(&self) -> usize {
        self.backend.rank()
    }
    /// Number of ranks.
    pub fn get_size(&self) -> usize {
        self.backend.size()
    }
    /// Name given at creation.
    pub fn get_name(&self) -> &str {
        self.backend.comm_name()
    }
    /// The device this communicator serves.
    pub fn device(&self) -> Device {
        self.backend.device()
    }
    /// The backend name passed to `new_comm` (inherited by split children).
    pub fn get_backend(&self) -> &str {
        &self.backend_name
    }
    /// Version of the engine behind the backend.
    pub fn get_backend_version(&self) -> Result<String> {
        self.backend.version()
    }
    /// The options this communicator was created with.
    pub fn get_options(&self) -> &CommOptions {
        &self.options
    }
    /// The backend (for backend-specific calls).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Runs a batch of sends and receives concurrently.
    pub fn batch_p2p(&self, ops: &[P2POp], opts: &OpOptions) -> Result<Work> {
        let c = self.check("batch_op_issue")?;
        if ops.is_empty() {
            return Err(c.fail(
                "ops",
                "at least one send or recv in the batch",
                "an empty batch",
            ));
        }
        for (i, op) in ops.iter().enumerate() {
            c.tensor(&format!("ops[{i}].tensor"), op.tensor())?;
            c.peer(&format!("ops[{i}].peer"), op.peer())?;
        }
        self.run(Call::Batch { ops: ops.to_vec() }, opts)
    }

    /// Starts a batch of point-to-point operations.
    pub fn batch_op_create(&self) -> crate::batch::BatchSendRecv<'_> {
        crate::batch::BatchSendRecv::new(self)
    }

    /// Splits off a communicator of `ranks` (ranks of this communicator). A collective: every
    /// rank calls it; ranks passing an empty list get `None`. The new rank is the position of
    /// this rank in `ranks`. Without `options` the child gets fresh default options with this
    /// communicator's timeout, so a failed peer during the split (and later) fails the others as
    /// soon as it would fail this communicator.
    pub fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: Option<CommOptions>,
    ) -> Result<Option<TorchComm>> {
        let c = self.check("split")?;
        let n = self.get_size();
        let mut seen = vec![false; n];
        for &r in ranks {
            if r >= n {
                return Err(c.fail("ranks", format!("ranks in range [0, {n})"), r));
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(c.fail("ranks", "a list without duplicates", format!("{ranks:?}")));
            }
        }
        if !ranks.is_empty() && !seen[self.get_rank()] {
            return Err(c.fail(
                "ranks",
                format!(
                    "a list that contains this rank ({}) or is empty",
                    self.get_rank()
                ),
                format!("{ranks:?}"),
            ));
        }
        if name.is_empty() {
            return Err(c.fail("name", "a non-empty name", "\"\""));
        }
        let options = options.unwrap_or_else(|| CommOptions {
            timeout: self.options.timeout,
            ..CommOptions::default()
        });
        let child = self.backend.split(ranks, name, options.clone())?;
        Ok(child.map(|b| TorchComm::new(b, &self.backend_name, options)))
    }

    /// Waits for outstanding work and releases the communicator; later operations fail.
    pub fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.backend.finalize()
    }

    /// True after [`TorchComm::finalize`].
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Whether the backend can abort.
    pub fn is_abort_supported(&self) -> bool {
        self.backend.supports_abort()
    }

    /// Fails outstanding and future work.
    pub fn abort(&self) -> Result<()> {
        self.backend.abort()
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.backend.is_aborted()
    }

    /// A one-sided window of this communicator; with `tensor`, registers it (collective).
    pub fn new_window(&self, tensor: Option<&Tensor>) -> Result<crate::window::Window> {
        if self.is_finalized() {
            return Err(Error::Finalized {
                op: "new_window".into(),
                comm: self.get_name().into(),
            });
        }
        let w = crate::window::Window::new(
            self.backend.new_window()?,
            self.get_rank(),
            self.get_size(),
        );
        if let Some(t) = tensor {
            w.tensor_register(t)?;
        }
        Ok(w)
    }
}
