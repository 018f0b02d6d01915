//! Persistent all-gather (upstream's `all_gather_p_init` / `_exec` / `_free`): the output is
//! bound once, then every `all_gather_p_exec` gathers each rank's input into it.
//!
//! Asked to (the hint `window=true`), where the backend has windows for the output's device,
//! `init` registers the output as a window (collective) and every execution writes this rank's
//! input straight into each peer's output with a one-sided put:
//!
//! 1. a signal to every peer: "my output is free for this round";
//! 2. per peer: wait for its free signal, put the input into its block, signal it;
//! 3. a wait for every peer's data signal.
//!
//! The free signal keeps a fast rank from overwriting an output its peer still reads from the
//! previous round. A backend may run the round as one operation
//! ([`crate::WindowBackend::all_gather`]: over NVLink, one kernel launch). Otherwise (the
//! default, see [`TorchComm::all_gather_p_init`]) executions run the backend's all-gather into
//! the bound output.

use std::sync::Arc;

use crate::check::Check;
use crate::comm::TorchComm;
use crate::error::{Error, Result};
use crate::options::{parse_env_bool, Hints, OpOptions};
use crate::tensor::Tensor;
use crate::window::Window;
use crate::work::Work;

/// The hint of `all_gather_p_init` that picks windows or an all-gather (`auto`, `true`,
/// `false`).
pub const WINDOW_HINT: &str = "window";

/// The handle of a persistent all-gather: the output it fills, bound to one communicator.
#[derive(Debug, Clone)]
pub struct AllGatherP {
    output: Tensor,
    comm: String,
    size: usize,
    /// The output registered as a window, where the backend has windows for its device.
    window: Option<Arc<Window>>,
}

impl AllGatherP {
    /// The output every execution fills: `size` blocks, one per rank, in rank order.
    pub fn output(&self) -> &Tensor {
        &self.output
    }

    /// Ranks of its communicator (blocks of the output).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether executions run on one-sided puts into a window over the output (else as an
    /// all-gather).
    pub fn uses_window(&self) -> bool {
        self.window.is_some()
    }
}

impl TorchComm {
    /// Binds `output` (a tensor of `size` equal blocks) for later
    /// [`all_gather_p_exec`](TorchComm::all_gather_p_exec) calls. Collective when the output
    /// becomes a window (every rank calls it, with outputs of one size and the same hints).
    ///
    /// The hint [`WINDOW_HINT`] picks how executions run: `true` puts into a window over the
    /// output wherever the backend has one (over NVLink one kernel launch per round); `auto`
    /// (the default) and `false` run the backend's all-gather, which measured faster than the
    /// window at small sizes on CPU and on 2 and 4 H200 and no slower at 16-64 MiB
    /// (`docs/perf/onesided.md`).
    pub fn all_gather_p_init(&self, output: &Tensor, hints: &Hints) -> Result<AllGatherP> {
        let c = self.check("all_gather_p_init")?;
        c.tensor("output", output)?;
        c.divisible_by_size("output", output)?;
        let wanted = match hints.get(WINDOW_HINT).map(String::as_str) {
            None | Some("auto") => false,
            Some(v) => parse_env_bool(WINDOW_HINT, v).map_err(|_| {
                c.fail(
                    "hints",
                    format!("`{WINDOW_HINT}` set to auto, true or false"),
                    format!("`{v}`"),
                )
            })?,
        };
        let window = if wanted {
            self.persistent_window(output)?
        } else {
            None
        };
        Ok(AllGatherP {
            output: output.clone(),
            comm: self.get_name().to_string(),
            size: self.get_size(),
            window,
        })
    }

    /// Releases a handle of [`all_gather_p_init`](TorchComm::all_gather_p_init) (its output is
    /// the caller's again once the last execution completed). Collective when the handle holds
    /// a window (its deregistration waits for every rank's puts).
    pub fn all_gather_p_free(&self, handle: AllGatherP) -> Result<()> {
        let c = self.check("all_gather_p_free")?;
        c.persistent("handle", &handle)?;
        if let Some(w) = handle.window {
            if w.get_size() > 0 {
                w.tensor_deregister()?;
            }
        }
        Ok(())
    }

    /// A window over `output` when the backend has windows for it; `None` otherwise (one
    /// rank, an empty or strided output, a backend or device without windows).
    fn persistent_window(&self, output: &Tensor) -> Result<Option<Arc<Window>>> {
        if self.get_size() < 2 || output.nbytes() == 0 || !output.is_contiguous() {
            return Ok(None);
        }
        let backend = match self.backend.new_window() {
            Ok(b) => b,
            Err(Error::NotImplemented { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !backend.supports(output) {
            return Ok(None);
        }
        let w = Window::new(backend, self.get_rank(), self.get_size());
        w.tensor_register(output)?;
        Ok(Some(Arc::new(w)))
    }

    /// Runs a persistent all-gather: on its window where it has one, else as an all-gather.
    pub(crate) fn run_persistent(
        &self,
        handle: &AllGatherP,
        input: &Tensor,
        opts: &OpOptions,
    ) -> Result<Work> {
        let Some(w) = &handle.window else {
            let call = crate::Call::AllGather {
                outputs: handle.output.blocks(self.get_size(), input.numel()),
                input: input.clone(),
            };
            return self.run(call, opts);
        };
        let (rank, size) = (self.get_rank(), self.get_size());
        let offset = rank * input.numel() * input.dtype().size_bytes();
        if let Some(work) = w.fused_all_gather(input, offset, opts) {
            return work;
        }
        let step = OpOptions {
            async_op: true,
            ..opts.clone()
        };
        let block = input.numel();
        let peers: Vec<usize> = (1..size).map(|i| (rank + i) % size).collect();
        let mut works = Vec::with_capacity(4 * size);
        for &p in &peers {
            works.push(w.signal(p, &step)?);
        }
        // Unless the input already is this rank's block (in place).
        if handle.output.addr() + offset != input.addr() {
            works.push(w.put(input, rank, rank * block, &step)?);
        }
        for &p in &peers {
            works.push(w.wait_signal(p, &step)?);
            works.push(w.put(input, p, rank * block, &step)?);
            works.push(w.signal(p, &step)?);
        }
        for &p in &peers {
            works.push(w.wait_signal(p, &step)?);
        }
        let timeout = opts.timeout_or(self.get_options().timeout);
        let work = Work::all(works, timeout);
        if !opts.async_op {
            work.wait()?;
        }
        Ok(work)
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
