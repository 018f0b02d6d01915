//! Persistent all-gather (upstream's `all_gather_p_init` / `_exec` / `_free`): the output is
//! bound once, then every `all_gather_p_exec` gathers each rank's input into it. Binding the
//! output up front lets a backend prepare it once (register or export it) and lets callers
//! keep one buffer across iterations.

use crate::check::Check;
use crate::comm::TorchComm;
use crate::error::Result;
use crate::tensor::Tensor;

/// The handle of a persistent all-gather: the output it fills, bound to one communicator.
#[derive(Debug, Clone)]
pub struct AllGatherP {
    output: Tensor,
    comm: String,
    size: usize,
}

impl AllGatherP {
    /// The output every execution fills: `size` blocks, one per rank, in rank order.
    pub fn output(&self) -> &Tensor {
        &self.output
    }
}

impl TorchComm {
    /// Binds `output` (a tensor of `size` equal blocks) for later
    /// [`all_gather_p_exec`](TorchComm::all_gather_p_exec) calls. Local: no rank waits for
    /// another.
    pub fn all_gather_p_init(&self, output: &Tensor) -> Result<AllGatherP> {
        let c = self.check("all_gather_p_init")?;
        c.tensor("output", output)?;
        c.divisible_by_size("output", output)?;
        Ok(AllGatherP {
            output: output.clone(),
            comm: self.get_name().to_string(),
            size: self.get_size(),
        })
    }

    /// Releases a handle of [`all_gather_p_init`](TorchComm::all_gather_p_init) (its output is
    /// the caller's again once the last execution completed).
    pub fn all_gather_p_free(&self, handle: AllGatherP) -> Result<()> {
        let c = self.check("all_gather_p_free")?;
        c.persistent("handle", &handle)?;
        drop(handle);
        Ok(())
    }
}

impl Check<'_> {
    /// A persistent all-gather bound on this communicator.
    pub fn persistent(&self, arg: &str, handle: &AllGatherP) -> Result<()> {
        if handle.comm != self.comm_name() || handle.size != self.size() {
            return Err(self.fail(
                arg,
                format!(
                    "a handle of all_gather_p_init on communicator `{}`",
                    self.comm_name()
                ),
                format!("one of communicator `{}`", handle.comm),
            ));
        }
        Ok(())
    }
}
